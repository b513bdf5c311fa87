#include <stdio.h>

#include "daemon/serve.h"

int serve_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "kvshared: serving is not built yet\n");
  return 1;
}

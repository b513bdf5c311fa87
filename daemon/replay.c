#include <stdio.h>

#include "daemon/replay.h"

int replay_main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "kvshared replay: not built yet\n");
  return 1;
}

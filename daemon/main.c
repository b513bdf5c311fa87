/*
 * kvshared — the kvshare daemon.
 *
 *   kvshared [serve] [options]   run the daemon (the default)
 *   kvshared replay [options]    replay a request trace through the core
 */
#include <stdio.h>
#include <string.h>

#include "daemon/replay.h"
#include "daemon/serve.h"

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "replay") == 0)
    return replay_main(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "serve") == 0)
    return serve_main(argc - 1, argv + 1);
  return serve_main(argc, argv);
}

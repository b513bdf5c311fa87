/*
 * kvshared — the kvshare daemon.
 *
 *   kvshared [serve] [options]   run the daemon (the default)
 *   kvshared replay [options]    the same as kvshare-replay [options]: the
 *                                trace replayer, a program of its own
 *                                (tools/replay/) that the daemon does not
 *                                link; run from kvshared's own folder
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon/serve.h"

/* Runs kvshare-replay from the folder kvshared was run from (argv[0] is
 * "replay"); returns only when that fails. */
static int replay_alias(char **argv) {
  char self[PATH_MAX], path[PATH_MAX + 32];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  char *slash;

  if (n <= 0) {
    fprintf(stderr, "kvshared replay: cannot find my own folder: %s\n",
            strerror(errno));
    return 2;
  }
  self[n] = '\0';
  slash = strrchr(self, '/');
  *slash = '\0';
  snprintf(path, sizeof(path), "%s/kvshare-replay", self);
  argv[0] = path;
  execv(path, argv);
  fprintf(stderr, "kvshared replay: cannot run %s: %s (the replayer is "
          "kvshare-replay, installed beside kvshared)\n", path,
          strerror(errno));
  return 2;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "replay") == 0)
    return replay_alias(argv + 1);
  if (argc > 1 && strcmp(argv[1], "serve") == 0)
    return serve_main(argc - 1, argv + 1);
  return serve_main(argc, argv);
}

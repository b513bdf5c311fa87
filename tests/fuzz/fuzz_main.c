/*
 * fuzz_main.c — the libFuzzer target's sources without libFuzzer: each
 * argument, a file or a folder of files (a corpus, a crash input), goes
 * through LLVMFuzzerTestOneInput once.  `make test` links it from exactly
 * the sources `make fuzz` compiles (FUZZ_SRCS), so that list cannot rot
 * unseen, and it replays a crash found elsewhere without clang.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz_target.h"

static unsigned long n_inputs;

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  uint8_t *buf = NULL;
  long len;

  if (!f || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 ||
      fseek(f, 0, SEEK_SET) != 0 || !(buf = malloc((size_t)len + 1)) ||
      fread(buf, 1, (size_t)len, f) != (size_t)len) {
    fprintf(stderr, "fuzz_main: %s: %s\n", path,
            errno ? strerror(errno) : "short read");
    if (f)
      fclose(f);
    free(buf);
    return -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)len);
  free(buf);
  n_inputs++;
  return 0;
}

static int run_path(const char *path) {
  struct stat st;
  struct dirent *e;
  DIR *d;
  int rc = 0;

  if (stat(path, &st) != 0) {
    fprintf(stderr, "fuzz_main: %s: %s\n", path, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode))
    return run_file(path);
  if (!(d = opendir(path))) {
    fprintf(stderr, "fuzz_main: %s: %s\n", path, strerror(errno));
    return -1;
  }
  while (rc == 0 && (e = readdir(d)) != NULL) {
    char sub[4096];

    if (e->d_name[0] == '.')
      continue;
    snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
    rc = run_file(sub);
  }
  closedir(d);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
    return 2;
  }
  for (int i = 1; i < argc; i++)
    if (run_path(argv[i]) != 0)
      return 1;
  fuzz_dispatch_report(stdout);
  printf("%lu inputs: no crash, no leak, pool whole\n", n_inputs);
  return n_inputs ? 0 : 1;
}

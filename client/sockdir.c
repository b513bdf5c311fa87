/*
 * sockdir.c — libkvshare: a socket folder of one daemon per GPU.
 *
 * kvshared started with socket_dir names its socket by the pool's GPU:
 * <dir>/<GPU UUID>.sock, or <dir>/kvshared.sock with a host pool
 * (kvs_frame.h).  kvs_connect given a folder picks the socket of the GPU
 * this process uses, as the environment says it:
 *   - CUDA_VISIBLE_DEVICES, when its first entry is a UUID (GPU-... or
 *     MIG-...): that device is CUDA's device 0, the one a worker uses
 *     unless it chooses another;
 *   - else NVIDIA_VISIBLE_DEVICES, the devices the NVIDIA container runtime
 *     gave the container (the device plugin writes their UUIDs there, or,
 *     with its volume-mounts strategy, a folder whose entries are named by
 *     them): the one of them that has a daemon in the folder;
 *   - no UUID anywhere: the folder's kvshared.sock (a host pool).
 * Anything else fails with KVS_ENODEV and a message that names this
 * process's GPUs, the folder and the GPUs whose daemons are in it.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "client/client_int.h"
#include "kvs_frame.h"

#define MAX_GPUS 64
#define UUID_MAX 64

typedef struct gpu_list {
  int n;
  char uuid[MAX_GPUS][UUID_MAX];
} gpu_list;

static int is_uuid(const char *s, size_t len) {
  return len > 4 && len < UUID_MAX &&
         (strncmp(s, "GPU-", 4) == 0 || strncmp(s, "MIG-", 4) == 0);
}

static void add(gpu_list *g, const char *s, size_t len) {
  for (int i = 0; i < g->n; i++) /* (a GPU listed twice is one GPU) */
    if (strlen(g->uuid[i]) == len && strncmp(g->uuid[i], s, len) == 0)
      return;
  if (g->n < MAX_GPUS && is_uuid(s, len)) {
    memcpy(g->uuid[g->n], s, len);
    g->uuid[g->n][len] = '\0';
    g->n++;
  }
}

/* The UUIDs in a comma-separated list (first_only: its first entry only). */
static void add_list(gpu_list *g, const char *list, int first_only) {
  const char *p = list + strspn(list, " ");

  while (*p) {
    size_t len = strcspn(p, ",");

    while (len && p[len - 1] == ' ')
      len--;
    add(g, p, len);
    if (first_only)
      return;
    p += strcspn(p, ",");
    if (*p == ',')
      p++;
    while (*p == ' ')
      p++;
  }
}

/* The entries of a folder whose names are UUIDs (suffix stripped; "" for
 * none). */
static void add_dir(gpu_list *g, const char *dir, const char *suffix) {
  DIR *d = opendir(dir);
  struct dirent *e;
  size_t sl = strlen(suffix);

  if (!d)
    return;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);

    if (len > sl && strcmp(e->d_name + len - sl, suffix) == 0)
      add(g, e->d_name, len - sl);
  }
  closedir(d);
}

/* This process's GPUs by the environment; *from names the variable. */
static void visible_gpus(gpu_list *g, const char **from) {
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  const char *nvd = getenv("NVIDIA_VISIBLE_DEVICES");

  g->n = 0;
  *from = NULL;
  if (cvd && *cvd) {
    add_list(g, cvd, 1);
    if (g->n) {
      *from = "CUDA_VISIBLE_DEVICES";
      return;
    }
  }
  if (nvd && nvd[0] == '/')
    add_dir(g, nvd, "");
  else if (nvd)
    add_list(g, nvd, 0);
  if (g->n)
    *from = "NVIDIA_VISIBLE_DEVICES";
}

static int is_socket(const char *path) {
  struct stat st;

  return stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* Appends "a, b, c" (or "none") to msg. */
static void append_list(char *msg, size_t cap, const gpu_list *g) {
  size_t at = strlen(msg);

  if (!g->n)
    snprintf(msg + at, cap - at, "none");
  for (int i = 0; i < g->n && at < cap; i++) {
    snprintf(msg + at, cap - at, "%s%s", i ? ", " : "", g->uuid[i]);
    at += strlen(msg + at);
  }
}

int kvs__socket_in_dir(const char *dir, char *out, size_t out_len, char *msg,
                       size_t msg_len) {
  gpu_list mine, daemons, match;
  const char *from;
  size_t at;
  int n;

  visible_gpus(&mine, &from);
  daemons.n = 0;
  add_dir(&daemons, dir, KVS_SOCKET_GPU_SUFFIX);
  match.n = 0;
  for (int i = 0; i < mine.n; i++) {
    n = snprintf(out, out_len, "%s/%s" KVS_SOCKET_GPU_SUFFIX, dir,
                 mine.uuid[i]);
    if (n > 0 && (size_t)n < out_len && is_socket(out))
      add(&match, mine.uuid[i], strlen(mine.uuid[i]));
  }
  if (match.n == 1) {
    n = snprintf(out, out_len, "%s/%s" KVS_SOCKET_GPU_SUFFIX, dir,
                 match.uuid[0]);
    return 0;
  }
  if (!mine.n) {
    n = snprintf(out, out_len, "%s/" KVS_SOCKET_HOST_NAME, dir);
    if (n > 0 && (size_t)n < out_len && is_socket(out))
      return 0;
  }
  out[0] = '\0';
  if (match.n > 1) {
    snprintf(msg, msg_len, "%s holds the daemons of several GPUs this "
             "process sees (%s): ", dir, from);
    append_list(msg, msg_len, &match);
    at = strlen(msg);
    snprintf(msg + at, msg_len - at, "; set CUDA_VISIBLE_DEVICES to the "
             "UUID of the GPU it uses, or KVS_SOCKET to that GPU's socket");
  } else if (mine.n) {
    snprintf(msg, msg_len, "no daemon for this process's GPU in %s: %s "
             "names ", dir, from);
    append_list(msg, msg_len, &mine);
    at = strlen(msg);
    snprintf(msg + at, msg_len - at, "; the folder has daemons for: ");
    append_list(msg, msg_len, &daemons);
    at = strlen(msg);
    snprintf(msg + at, msg_len - at, " (run one per GPU with socket_dir, "
             "or request the GPU of a daemon)");
  } else {
    snprintf(msg, msg_len, "%s is a socket folder, and neither "
             "CUDA_VISIBLE_DEVICES nor NVIDIA_VISIBLE_DEVICES names this "
             "process's GPU by UUID (GPU-...), and no host pool's "
             KVS_SOCKET_HOST_NAME " is there; the folder has daemons for: ",
             dir);
    append_list(msg, msg_len, &daemons);
    at = strlen(msg);
    snprintf(msg + at, msg_len - at, " (set CUDA_VISIBLE_DEVICES=GPU-..., "
             "or KVS_SOCKET to one socket)");
  }
  return KVS_ENODEV;
}

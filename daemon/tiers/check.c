/*
 * check.c — tiers_check (tiers.h): the checks of the tiers' settings made
 * at start-up, before the pool is allocated.  A file of its own so that the
 * programs that link tiers.c without the tiers themselves (the fuzz
 * target) need not link the remote tier.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon/tiers/tiers.h"
#include "kvs_status.h"

/* The disk tier's file can be opened for writing, or created. */
static int check_disk_path(const char *path, char *err, size_t err_len) {
  char dir[sizeof(((cfg *)0)->disk_tier)];
  char *slash;

  if (access(path, R_OK | W_OK) == 0)
    return 0;
  if (errno != ENOENT) {
    snprintf(err, err_len, "disk_tier %s: %s", path, strerror(errno));
    return KVS_EINVAL;
  }
  snprintf(dir, sizeof(dir), "%s", path);
  slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, sizeof(dir), ".");
  else if (slash == dir)
    dir[1] = '\0';
  else
    *slash = '\0';
  if (access(dir, W_OK | X_OK) < 0) {
    snprintf(err, err_len, "disk_tier %s: cannot create it in %s: %s", path,
             dir, strerror(errno));
    return KVS_EINVAL;
  }
  return 0;
}

int tiers_check(const cfg *c, char *err, size_t err_len) {
  int rc;

  if (c->disk_tier[0]) {
    rc = check_disk_path(c->disk_tier, err, err_len);
    if (rc < 0)
      return rc;
  }
  if (c->remote_tier[0])
    return tier_remote_check(c->remote_tier, c->remote_tier_password_file,
                             err, err_len);
  return 0;
}

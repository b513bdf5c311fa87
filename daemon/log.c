#include "daemon/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kvs_status.h"

int log_level_cur = LOG_INFO;

static const char *const names[] = {"error", "warn", "info", "debug"};

int log_level_parse(const char *name) {
  int i;

  for (i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++)
    if (strcmp(name, names[i]) == 0)
      return i;
  if (strcmp(name, "warning") == 0)
    return LOG_WARN;
  return -1;
}

const char *log_level_name(int level) {
  if (level < 0 || level >= (int)(sizeof(names) / sizeof(names[0])))
    return "?";
  return names[level];
}

void log_write(int level, int err, const char *fmt, ...) {
  char line[1024];
  struct timespec ts;
  struct tm tm;
  size_t n;
  va_list ap;

  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
  n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ldZ kvshared %s: ",
                        ts.tv_nsec / 1000000, log_level_name(level));
  va_start(ap, fmt);
  if (n < sizeof(line))
    n += (size_t)vsnprintf(line + n, sizeof(line) - n, fmt, ap);
  va_end(ap);
  if (err != 0 && n < sizeof(line))
    n += (size_t)snprintf(line + n, sizeof(line) - n, ": %s",
                          kvs_strerror(err > 0 ? -err : err));
  if (n >= sizeof(line) - 1)
    n = sizeof(line) - 2;
  line[n++] = '\n';
  fwrite(line, 1, n, stderr);
}

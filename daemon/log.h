/*
 * log.h — the daemon's log: one line per event on stderr, with a level.
 *
 *   log_error(errno_value, "bind %s", path);   ": <strerror>" appended when
 *   log_info(0, "listening on %s", path);       the first argument is nonzero
 *
 * The first argument is an error number, passed explicitly: a positive errno,
 * a negative -errno or kvs_status, or 0 for none.  The macros test the level
 * before they evaluate their arguments.  Only the daemon logs; the libraries
 * (proto/, shm/, client/) return statuses instead.
 */
#ifndef KVS_DAEMON_LOG_H
#define KVS_DAEMON_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

extern int log_level_cur;

/* "error", "warn", "info", "debug" -> level; -1 when unknown. */
int log_level_parse(const char *name);
const char *log_level_name(int level);

void log_write(int level, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_at(lvl, err, ...)                 \
  do {                                        \
    if ((lvl) <= log_level_cur)               \
      log_write((lvl), (err), __VA_ARGS__);   \
  } while (0)
#define log_error(err, ...) log_at(LOG_ERROR, err, __VA_ARGS__)
#define log_warn(err, ...) log_at(LOG_WARN, err, __VA_ARGS__)
#define log_info(err, ...) log_at(LOG_INFO, err, __VA_ARGS__)
#define log_debug(err, ...) log_at(LOG_DEBUG, err, __VA_ARGS__)

#endif

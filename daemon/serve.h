#ifndef KVS_DAEMON_SERVE_H
#define KVS_DAEMON_SERVE_H
/* `kvshared [serve] ...`: run the daemon.  Returns the exit status. */
int serve_main(int argc, char **argv);
#endif

#ifndef KVS_DAEMON_REPLAY_H
#define KVS_DAEMON_REPLAY_H
/* `kvshared replay ...`: argv[0] is "replay".  Returns the exit status. */
int replay_main(int argc, char **argv);
#endif

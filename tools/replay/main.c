/*
 * kvshare-replay — replays a request trace through the core, in-process
 * (replay.h).  `kvshare-replay --help` lists the options.
 */
#include "tools/replay/replay.h"

int main(int argc, char **argv) { return replay_main(argc, argv); }

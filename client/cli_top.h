/*
 * cli_top.h — `kvshare top` (top.c), called by the CLI's command dispatch
 * (kvshare_cli.c) with the whole command line and the CLI's usage printer.
 * Returns the process's exit status.
 */
#ifndef KVS_CLIENT_CLI_TOP_H
#define KVS_CLIENT_CLI_TOP_H

#include <stdio.h>

int kvs__cli_top(int argc, char **argv, void (*usage)(FILE *));

#endif

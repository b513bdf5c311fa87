/*
 * cli.h — the pieces of the kvshare CLI that its files share: `kvshare top`
 * (top.c), called by the command dispatch (kvshare_cli.c) with the whole
 * command line and the CLI's usage printer; and the CLI's JSON string
 * printer (kvshare_cli.c), used by both.
 */
#ifndef KVS_CLIENT_CLI_H
#define KVS_CLIENT_CLI_H

#include <stdio.h>

/* Returns the process's exit status. */
int kvs__cli_top(int argc, char **argv, void (*usage)(FILE *));

/* Prints s on stdout as a JSON string literal. */
void kvs__cli_json_str(const char *s);

#endif

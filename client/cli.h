/*
 * cli.h — the pieces of the kvshare CLI that its files share: `kvshare top`
 * (top.c), called by the command dispatch (kvshare_cli.c) with the whole
 * command line and the CLI's usage printer; and the CLI's JSON string
 * printer (kvshare_cli.c), used by both.
 */
#ifndef KVS_CLIENT_CLI_H
#define KVS_CLIENT_CLI_H

#include <stdio.h>

#include "client/kvshare.h"
#include "client/sockpath.h"

/* Returns the process's exit status. */
int kvs__cli_top(int argc, char **argv, void (*usage)(FILE *));

/* Connects to the daemon at *path; a NULL *path becomes the default socket
 * (sockpath.h), so *path names the socket tried either way.  0, or 3 (the
 * CLI's exit status) after a message on stderr that names the path. */
int kvs__cli_connect(const char **path, const kvs_connect_opts *opts,
                     kvs_client **c);

/* Prints s on stdout as a JSON string literal. */
void kvs__cli_json_str(const char *s);

#endif

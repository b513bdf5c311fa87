#!/bin/bash
# make demo: start kvshared in a temporary directory, run workers, report.
set -eu
echo "kvshare demo: not yet (the daemon lands with the protocol issue)"

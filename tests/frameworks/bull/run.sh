#!/usr/bin/env bash
# bull suite: installs the pinned Bull 4 (npm ci) when missing, then runs
# suite.js against Kite --threads 1 and --threads 4 (FW_SERVER=redis: against
# redis-server instead). See ../lib.sh for the environment it reads.
set -euo pipefail
FW_NAME=bull
DIR="$(cd "$(dirname "$0")" && pwd)"
. "$DIR/../lib.sh"
fw_npm_ci "$DIR"
run() { node "$DIR/suite.js" "$FW_URL"; }
fw_run_configs run

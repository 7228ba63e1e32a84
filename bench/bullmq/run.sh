#!/usr/bin/env bash
# BullMQ add-job benchmark: installs its npm dependencies when missing, then runs add.mjs
# with the given arguments (see add.mjs). Used by `kite-bench bullmq-add`.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -d node_modules/bullmq ]; then
    command -v npm >/dev/null 2>&1 || {
        echo "npm not found: apt-get install -y nodejs npm" >&2
        exit 1
    }
    echo "bullmq: npm install" >&2
    npm install --no-audit --no-fund --loglevel=error >&2
fi
exec node add.mjs "$@"

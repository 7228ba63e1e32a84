#!/usr/bin/env bash
# BullMQ add-job benchmark: installs its npm dependencies when missing, then runs add.mjs
# (or process.mjs, when the first argument is `process`) with the given arguments.
# Used by `kite-bench bullmq-add` and `kite-bench bullmq-process`.
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
# `run.sh process ...` runs process.mjs; anything else is add.mjs's arguments.
script=add.mjs
if [ "${1:-}" = "process" ]; then
    script=process.mjs
    shift
fi
exec node "$script" "$@"

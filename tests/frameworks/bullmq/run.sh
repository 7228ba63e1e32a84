#!/usr/bin/env bash
# BullMQ suite: installs the pinned npm dependencies when missing, then runs suite.mjs
# against a fresh server per configuration: Kite at each of FW_THREADS (default "1 4"),
# each with BullMQ's default prefix "bull" and the hashtag prefix "{bq}"; with
# FW_SERVER=redis, redis-server once per prefix. Extra arguments name scenarios to run;
# FW_PREFIXES overrides the prefixes, FW_SUITE_TIMEOUT (s, default 600) bounds each run.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
FW_NAME=bullmq
. "$HERE/../lib.sh"

fw_npm_ci "$HERE"
if [ "$FW_SERVER" != "redis" ] && [ ! -x "$KITE_BIN" ]; then
    echo "Kite binary not found at $KITE_BIN: cargo build --release" >&2
    exit 1
fi

PREFIXES="${FW_PREFIXES:-bull {bq\}}"
failed=()
for threads in $(fw_configs); do
    for prefix in $PREFIXES; do
        label="$FW_SERVER"
        [ "$FW_SERVER" = "redis" ] || label="kite --threads $threads"
        label="$label, prefix $prefix"
        fw_start_server "$threads"
        fw_log "$label (port $FW_PORT)"
        if ! timeout "${FW_SUITE_TIMEOUT:-600}" node "$HERE/suite.mjs" "$FW_URL" "$prefix" "$@"; then
            failed+=("$label")
            fw_log "FAILED: $label; end of the server log:"
            tail -n 20 "$FW_LOG" >&2 || true
        fi
        fw_stop_server
        rm -f "$FW_LOG"
    done
done
if [ "${#failed[@]}" -ne 0 ]; then
    fw_log "failed configurations: ${failed[*]}"
    exit 1
fi
fw_log "all configurations passed"

#!/usr/bin/env bash
# BullMQ suite: installs the pinned npm dependencies when missing, then runs suite.mjs
# against a fresh server per configuration: Kite at each of FW_THREADS (default "1 4"),
# each with BullMQ's default prefix "bull" and the hashtag prefix "{bq}"; with
# FW_SERVER=redis, redis-server once per prefix. Then kill9.mjs once per configuration:
# kill -9 in the middle of a workload with appendonly yes / appendfsync always, restart,
# no acknowledged job lost (FW_KILL9_RUNS=N repeats it with N seeds; KILL9_SEED=S replays
# one). Extra arguments name scenarios to run ("kill9" names the durability check);
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

# Scenario names select suite scenarios; "kill9" selects the durability check. No names:
# everything.
suite_args=()
run_suite=1
run_kill9=1
if [ "$#" -gt 0 ]; then
    run_kill9=0
    for a in "$@"; do
        if [ "$a" = kill9 ]; then run_kill9=1; else suite_args+=("$a"); fi
    done
    [ "${#suite_args[@]}" -gt 0 ] || run_suite=0
fi

PREFIXES="${FW_PREFIXES:-bull {bq\}}"
failed=()
[ "$run_suite" -eq 1 ] || PREFIXES=""
for threads in $(fw_configs); do
    for prefix in $PREFIXES; do
        label="$FW_SERVER"
        [ "$FW_SERVER" = "redis" ] || label="kite --threads $threads"
        label="$label, prefix $prefix"
        fw_start_server "$threads"
        fw_log "$label (port $FW_PORT)"
        if ! timeout "${FW_SUITE_TIMEOUT:-600}" node "$HERE/suite.mjs" "$FW_URL" "$prefix" ${suite_args[@]+"${suite_args[@]}"}; then
            failed+=("$label")
            fw_log "FAILED: $label; end of the server log:"
            tail -n 20 "$FW_LOG" >&2 || true
        fi
        fw_stop_server
        rm -f "$FW_LOG"
    done
done
# The durability check, with the default prefix (on Kite all keys of a queue on one shard,
# the three queues on different shards). See kill9.mjs.
if [ "$run_kill9" -eq 1 ]; then
    kill9() { timeout 180 node "$HERE/kill9.mjs" "$FW_URL" bull; }
    fw_run_kill9 kill9 || failed+=("kill9")
fi
if [ "${#failed[@]}" -ne 0 ]; then
    fw_log "failed configurations: ${failed[*]}"
    exit 1
fi
fw_log "all configurations passed"

#!/usr/bin/env bash
# What queue tracking costs (docs/observe.md): server instructions per job, counted by
# callgrind (not time: these machines are too noisy for a 3% budget), on kite-bench's
# drain (Sidekiq-shaped jobs LPUSHed, then BRPOPed) and bullmq-add (BullMQ's add script),
# for one or more server binaries, each with queue-tracking yes and no.
#
#   scripts/bench-queue-tracking.sh [KITE_BIN...]   (default: target/release/kite)
#
# Each run: start the server under callgrind at --threads 1, zero the counts once it
# answers (start-up does not count), run the workload, shut it down. bullmq-add's count
# includes the bench's clean-up of its jobs (Queue.obliterate), for every binary alike.
# Prints one line per binary, setting and workload.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=target/release/kite-bench
JOBS="${JOBS:-20000}"
ADD_SECONDS="${ADD_SECONDS:-20}"
[ "$#" -gt 0 ] || set -- target/release/kite
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# run BIN TRACKING WORKLOAD -> prints "instructions jobs"
run() {
    local bin="$1" tracking="$2" workload="$3" port dir pid jobs total
    port="$(free_port)"
    dir="$(mktemp -d)"
    local flags=()
    [ "$tracking" = "n/a" ] || flags=(--queue-tracking "$tracking")
    valgrind --tool=callgrind --callgrind-out-file="$dir/out.%p" "$bin" --port "$port" \
        --threads 1 --save "" --appendonly no --dir "$dir" "${flags[@]}" \
        >"$dir/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    callgrind_control -z "$pid" >/dev/null 2>&1 || true
    case "$workload" in
        drain)
            "$BENCH" drain --port "$port" --server-pid "$pid" --queues 1 --jobs "$JOBS" \
                --consumers 10 --max-seconds 600 >"$dir/bench.log" 2>&1
            jobs="$JOBS" ;;
        bullmq-add)
            "$BENCH" bullmq-add --port "$port" --server-pid "$pid" --queues 1 --workers 1 \
                --concurrency 32 --seconds "$ADD_SECONDS" --max-seconds 600 >"$dir/bench.log" 2>&1
            jobs="$(grep -o '"operations":[0-9]*' "$dir/bench.log" | head -1 | cut -d: -f2)" ;;
    esac
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" 2>/dev/null || true
    total="$(callgrind_annotate "$dir"/out.* 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')"
    echo "$total $jobs"
    rm -rf "$dir"
}

for bin in "$@"; do
    # A build from before queue tracking has no such setting: one run, as it is.
    settings="yes no"
    grep -q "queue-tracking" "$bin" || settings="n/a"
    for tracking in $settings; do
        for w in drain bullmq-add; do
            read -r total jobs < <(run "$bin" "$tracking" "$w")
            echo "$bin queue-tracking=$tracking $w: $(( total / jobs )) instructions/job ($jobs jobs, $total instructions)"
        done
    done
done

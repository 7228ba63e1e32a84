#!/usr/bin/env bash
# How far a replica falls behind a busy master: a Kite master (--threads 2) takes 400k
# pipelined SET and LPUSH (kite-bench ops, pipeline 16); then this prints how long the
# replica needs to reach the master's offset. Replicas: Kite at --threads 1 and 4, and
# redis-server. Loopback only; every server started here is stopped at the end.
#   bash scripts/bench-replica-lag.sh
set -euo pipefail
cd "$(dirname "$0")/.."
K=target/release/kite
B=target/release/kite-bench
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
offset() { redis-cli -p "$1" info replication | tr -d '\r' | grep "^$2:" | cut -d: -f2; }
for replica in kite:1 kite:4 redis; do
    mp=$((20000 + RANDOM % 10000)); rp=$((mp + 1))
    mkdir -p "$work/m$mp" "$work/r$rp"
    $K --port $mp --threads 2 --save "" --dir "$work/m$mp" --repl-diskless-sync-delay 0 >/dev/null 2>&1 & pids+=($!); mpid=$!
    if [ "$replica" = redis ]; then
        redis-server --port $rp --save "" --dir "$work/r$rp" >/dev/null 2>&1 & pids+=($!); rpid=$!
    else
        $K --port $rp --threads "${replica#kite:}" --save "" --dir "$work/r$rp" >/dev/null 2>&1 & pids+=($!); rpid=$!
    fi
    sleep 0.5
    redis-cli -p $rp replicaof 127.0.0.1 $mp >/dev/null
    for _ in $(seq 100); do [ "$(redis-cli -p $rp info replication | tr -d '\r' | grep master_link_status)" = "master_link_status:up" ] && break; sleep 0.1; done
    $B --port $mp ops --pipeline 16 --requests 400000 --commands set,lpush >/dev/null 2>&1
    t0=$(date +%s.%N)
    for _ in $(seq 1200); do
        [ "$(offset $mp master_repl_offset)" = "$(offset $rp slave_repl_offset)" ] && break
        sleep 0.05
    done
    t1=$(date +%s.%N)
    echo "replica $replica: caught up $(echo "$t1 - $t0" | bc) s after the load (master offset $(offset $mp master_repl_offset))"
    kill $mpid $rpid
done

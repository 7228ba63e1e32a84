#!/usr/bin/env bash
# How much CPU the AOF's single writer thread takes while the shards run a pipelined
# write load: the figure that says whether the merge into one stream caps Kite.
# Starts Kite with `--appendonly yes --appendfsync ${POLICY:-everysec}` on a free port in a
# fresh directory, runs kite-bench ops (SET and LPUSH, pipeline 16, ${N:-2000000} requests
# each), then prints each thread's CPU seconds from /proc and the writer's share.
#   scripts/bench-aof-writer.sh            (THREADS=2 POLICY=everysec N=2000000)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${KITE_BIN:-$ROOT/target/release/kite}"
BENCH="$ROOT/target/release/kite-bench"
DIR="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$BIN" --port "$PORT" --bind 127.0.0.1 --threads "${THREADS:-2}" --dir "$DIR" --save "" \
    --appendonly yes --appendfsync "${POLICY:-everysec}" >"$DIR/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
for cmd in set lpush; do
    "$BENCH" ops --port "$PORT" --commands "$cmd" --pipeline 16 --requests "${N:-2000000}" 2>&1 | tail -1
done
TICKS=$(getconf CLK_TCK)
total=0; writer=0
for t in /proc/$PID/task/*; do
    name=$(cat "$t/comm"); ticks=$(awk '{print $14+$15}' "$t/stat")
    printf '%-18s %6.2f s\n' "$name" "$(echo "$ticks / $TICKS" | bc -l)"
    total=$((total + ticks))
    [ "$name" = "kite-aof-writer" ] && writer=$ticks
done
echo "writer share of server CPU: $(echo "100 * $writer / $total" | bc -l | cut -c1-5)%"
echo "AOF bytes written: $(redis-cli -p "$PORT" info persistence | tr -d '\r' | grep aof_current_size)"

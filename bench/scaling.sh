#!/bin/bash
# Where Kite's CPU per request goes as threads grow (BENCHMARKS.md, "Scaling on 16
# cores"). Needs a machine with spare cores: servers run on $SRV, kite-bench on $CLI.
# For each server and depth (SET, 200 connections) it prints, per request: server user
# and system CPU (from /proc ticks), and Kite's INFO counters (passes of the thread
# loops, hops between threads, mailbox wake-ups). Every run is bounded by its request
# count; servers are stopped after each run.
#
#   KITE=target/release/kite KITE_BENCH=target/release/kite-bench REDIS=redis-server \
#   SRV=0-7 CLI=8-15 CT=8 THREADS="1 2 4 8 16" REPS=3 bash bench/scaling.sh
set -u
KITE=${KITE:-target/release/kite}; KITE_BENCH=${KITE_BENCH:-target/release/kite-bench}
REDIS=${REDIS:-redis-server}; SRV=${SRV:-0-7}; CLI=${CLI:-8-15}; CT=${CT:-8}
THREADS=${THREADS:-1 2 4 8 16}; REPS=${REPS:-3}; PORT=${PORT:-7400}
info() {
  exec 3<>/dev/tcp/127.0.0.1/$PORT
  printf 'INFO all\r\n' >&3
  timeout 0.5 cat <&3 > /tmp/scaling-info.txt
  exec 3>&-
}
field() { awk -F: -v f="$1" '$1==f {gsub("\r","",$2); print $2+0; exit}' /tmp/scaling-info.txt; }
ticks() { awk '{print $14, $15}' /proc/$1/stat; }
one() { # NAME DEPTH SERVER ARGS...
  local name=$1 p=$2; shift 2
  taskset -c "$SRV" "$@" --port $PORT --bind 127.0.0.1 --save '' --dir /tmp > /tmp/scaling-server.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.05; done
  sleep 0.2; info
  local p0 h0 w0 u0 k0 u1 k1
  p0=$(field event_loop_passes); h0=$(field hops); w0=$(field mailbox_wakeups)
  read -r u0 k0 < <(ticks $pid)
  local n=300000; [ "$p" = 16 ] && n=1600000
  local line
  line=$(taskset -c "$CLI" "$KITE_BENCH" --port $PORT --server-pid $pid --client-threads "$CT" \
    ops --commands set --pipeline "$p" --connections 200 --requests $n 2>&1 | grep "requests in" | sed 's/.*requests in [0-9.]* s = //; s/\/s.*//')
  read -r u1 k1 < <(ticks $pid)
  info
  local p1 h1 w1
  p1=$(field event_loop_passes); h1=$(field hops); w1=$(field mailbox_wakeups)
  kill $pid; wait $pid 2>/dev/null
  awk -v name="$name" -v p="$p" -v n=$n -v ops="$line" -v u=$((u1-u0)) -v k=$((k1-k0)) \
      -v ps=$((p1-p0)) -v hs=$((h1-h0)) -v ws=$((w1-w0)) 'BEGIN {
    tick = 1e6 / 100
    printf "%s\tP%d\t%s/s\tuser %.2f\tsys %.2f µs/req\tpasses/req %.3f\thops/req %.3f\twakeups/req %.3f\n",
      name, p, ops, u*tick/n, k*tick/n, ps/n, hs/n, ws/n }'
}
echo "nproc $(nproc); kernel $(uname -r); servers on $SRV, kite-bench on $CLI ($CT threads)"
for _ in $(seq 1 "$REPS"); do
  for p in 1 16; do
    one redis "$p" "$REDIS"
    for t in $THREADS; do one "kite t$t" "$p" "$KITE" --threads "$t"; done
  done
done

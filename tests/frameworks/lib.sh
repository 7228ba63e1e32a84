# Shared helpers for the job-framework suites (tests/frameworks/*/run.sh). Source it.
#
# Every suite runs its framework against a server it starts itself on a free loopback
# port, once per configuration, and checks end results. Environment:
#   KITE_BIN      the Kite binary (default: target/release/kite)
#   FW_SERVER     "kite" (default) or "redis": run the suite against redis-server
#                 instead, to check that the suite itself is right
#   FW_THREADS    Kite thread counts to run (default: "1 4")

FW_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KITE_BIN="${KITE_BIN:-$FW_ROOT/target/release/kite}"
FW_SERVER="${FW_SERVER:-kite}"
FW_THREADS="${FW_THREADS:-1 4}"
FW_PIDS=()

fw_log() { printf '==> [%s] %s\n' "${FW_NAME:-framework}" "$*" >&2; }

fw_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# fw_start_server THREADS [extra kite flags...]: starts a server, sets FW_PORT and
# FW_URL, waits for PING.
fw_start_server() {
    local threads="$1"; shift
    FW_PORT="$(fw_free_port)"
    FW_LOG="$(mktemp -t fw-server.XXXXXX.log)"
    if [ "$FW_SERVER" = "redis" ]; then
        redis-server --port "$FW_PORT" --bind 127.0.0.1 --save "" --appendonly no >"$FW_LOG" 2>&1 &
    else
        "$KITE_BIN" --port "$FW_PORT" --bind 127.0.0.1 --threads "$threads" --save "" "$@" >"$FW_LOG" 2>&1 &
    fi
    FW_SERVER_PID=$!
    FW_PIDS+=("$FW_SERVER_PID")
    FW_URL="redis://127.0.0.1:$FW_PORT"
    for _ in $(seq 1 100); do
        if [ "$(redis-cli -p "$FW_PORT" ping 2>/dev/null)" = "PONG" ]; then
            return 0
        fi
        sleep 0.1
    done
    echo "server did not start:" >&2
    cat "$FW_LOG" >&2
    return 1
}

fw_stop_server() {
    if [ -n "${FW_SERVER_PID:-}" ]; then
        kill "$FW_SERVER_PID" >/dev/null 2>&1 || true
        wait "$FW_SERVER_PID" 2>/dev/null || true
        FW_SERVER_PID=""
    fi
}

fw_cleanup() {
    for p in "${FW_PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" >/dev/null 2>&1 || true
    done
    # A durable server restarted by a test program is not in FW_PIDS (see below).
    if [ -n "${FW_STATE:-}" ] && [ -f "$FW_STATE/pid" ]; then
        kill "$(cat "$FW_STATE/pid")" >/dev/null 2>&1 || true
    fi
}
# Only when sourced: run as a program (`bash lib.sh restart`, below), lib.sh must not kill
# anything on exit.
[ "${BASH_SOURCE[0]}" = "$0" ] || trap fw_cleanup EXIT

# The thread counts to run: one pass against redis-server, else each of FW_THREADS.
fw_configs() {
    if [ "$FW_SERVER" = "redis" ]; then echo 1; else echo "$FW_THREADS"; fi
}

fw_sudo() {
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo "$@"; else "$@"; fi
}

# fw_apt_install PKG...: installs Debian packages (one apt-get update per run).
FW_APT_UPDATED=0
fw_apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ "$FW_APT_UPDATED" -eq 0 ]; then
        fw_log "apt-get update"
        fw_sudo apt-get update -qq >/dev/null
        FW_APT_UPDATED=1
    fi
    fw_log "apt-get install -y $*"
    fw_sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# fw_npm_ci DIR: installs DIR's pinned npm dependencies (package-lock.json) when
# DIR/node_modules is missing; installs node and npm from Debian when they are.
fw_npm_ci() {
    local dir="$1"
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        fw_apt_install nodejs npm
    fi
    if [ ! -d "$dir/node_modules" ]; then
        fw_log "npm ci in $dir"
        local out
        out="$(mktemp -t fw-npm.XXXXXX)"
        if ! (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >"$out" 2>&1); then
            grep -m 3 -E 'npm error (code|Missing|404)' "$out" >&2 || tail -n 5 "$out" >&2
            # npm ci refuses a lock file that lacks optional packages for other platforms
            # (msgpackr-extract-darwin-...), which a registry mirror without them yields.
            # npm install takes the same pinned versions from the lock; the committed
            # lock file is put back as it was.
            fw_log "npm ci failed; npm install from the same lock file"
            cp "$dir/package-lock.json" "$dir/.package-lock.json.orig"
            local rc=0
            (cd "$dir" && npm install --no-audit --no-fund --loglevel=error >&2) || rc=$?
            mv -f "$dir/.package-lock.json.orig" "$dir/package-lock.json"
            rm -f "$out"
            return "$rc"
        fi
        rm -f "$out"
    fi
}

# fw_run_configs CMD...: runs CMD once per configuration against a fresh server, with
# FW_URL, FW_PORT and FW_CONFIG (a label such as "kite --threads 4") exported. Shows the
# end of the server's log when CMD fails. Returns non-zero when any run failed.
fw_run_configs() {
    local threads status=0
    for threads in $(fw_configs); do
        fw_start_server "$threads" || { status=1; continue; }
        if [ "$FW_SERVER" = "redis" ]; then FW_CONFIG="redis-server"; else FW_CONFIG="kite --threads $threads"; fi
        export FW_URL FW_PORT FW_CONFIG
        fw_log "$FW_CONFIG on port $FW_PORT"
        if ! "$@"; then
            status=1
            fw_log "FAILED against $FW_CONFIG; end of the server log:"
            tail -n 20 "$FW_LOG" >&2 || true
        fi
        fw_stop_server
        rm -f "$FW_LOG"
    done
    return "$status"
}

# fw_python_venv NAME REQUIREMENTS_FILE: makes (or reuses) target/fw-venv-NAME with
# `python3 -m venv` and installs the pinned requirements into it; reinstalls only when the
# requirements file changed. Sets FW_VENV to the venv's folder.
fw_python_venv() {
    local name="$1" req="$2"
    FW_VENV="$FW_ROOT/target/fw-venv-$name"
    local stamp="$FW_VENV/.fw-requirements"
    if [ -x "$FW_VENV/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
        return 0
    fi
    fw_log "installing $(basename "$req") into $FW_VENV"
    if ! python3 -m venv "$FW_VENV" >/dev/null 2>&1; then
        # Debian splits venv (and its pip) out of python3.
        rm -rf "$FW_VENV"
        fw_apt_install python3-venv python3-pip
        python3 -m venv "$FW_VENV"
    fi
    "$FW_VENV/bin/pip" install --quiet --disable-pip-version-check -r "$req"
    cp "$req" "$stamp"
}

# fw_each_config CMD [ARGS...]: for each configuration (fw_configs), starts a server, runs
# CMD with FW_URL, FW_PORT and FW_CONFIG exported, stops the server. Prints one
# "PASS/FAIL <suite> <config>" line per configuration; returns non-zero if any failed.
fw_each_config() {
    local failed=0 threads config
    for threads in $(fw_configs); do
        if [ "$FW_SERVER" = "redis" ]; then config="redis-server"; else config="kite --threads $threads"; fi
        fw_log "running against $config"
        fw_start_server "$threads" || { failed=1; echo "FAIL ${FW_NAME:-framework} [$config] (server did not start)"; continue; }
        if FW_URL="$FW_URL" FW_PORT="$FW_PORT" FW_CONFIG="$config" "$@"; then
            echo "PASS ${FW_NAME:-framework} [$config]"
        else
            echo "FAIL ${FW_NAME:-framework} [$config]"
            failed=1
        fi
        fw_stop_server
    done
    return "$failed"
}

# --- durable servers: kill -9 and restart on the same data -------------------------------
# fw_start_durable_server THREADS [extra flags...] starts a server with the append-only file
# on and fsynced before every reply (Kite: --appendonly yes --appendfsync always --dir DIR;
# FW_SERVER=redis: redis-server with the same settings), on a fresh data directory. Its
# state lives in the folder FW_STATE (exported): data/ (the --dir; the AOF is in
# data/appendonlydir/), data-at-kill/ (a copy of data/ made before the restart), argv (the
# command line, one argument a line), pid, server.log (every start appends to it). A test
# program kills the server with SIGKILL itself (pid from $FW_STATE/pid, at the moment it
# chooses) and then runs
#     bash "$FW_LIB" restart          (FW_STATE in the environment)
# which starts the same command line again on the same port and directory, waits until it
# answers PING with PONG (not -LOADING: the AOF is read back first) and prints the new pid.
# The server's output goes to the log, not to the caller's pipes, so a program that runs
# `restart` and reads its output is not held open by the server; fw_stop_durable_server
# (and the EXIT trap) stop whichever server is current.
# Sets FW_PORT, FW_URL, FW_DATA_DIR, FW_LOG, FW_LIB.
FW_LIB="$FW_ROOT/tests/frameworks/lib.sh"

# _fw_alive PID: the process exists and is not a zombie (a killed server stays a zombie
# until its parent, init here, reaps it, and `kill -0` succeeds on a zombie).
_fw_alive() {
    local st
    st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
    [ -n "$st" ] && [ "$st" != "Z" ] && [ "$st" != "X" ]
}

# _fw_launch: starts the command line in $FW_STATE/argv; writes $FW_STATE/pid.
_fw_launch() {
    local -a argv
    mapfile -t argv <"$FW_STATE/argv"
    # Started from a subshell that exits at once, so the server is no child of this shell:
    # bash would report the SIGKILL ("Killed") when it reaps it.
    ("${argv[@]}" >>"$FW_STATE/server.log" 2>&1 </dev/null &
        echo $! >"$FW_STATE/pid")
}

# _fw_wait_pong PORT SECONDS: waits for PONG (a server reading its AOF answers -LOADING).
_fw_wait_pong() {
    local port="$1" deadline=$((SECONDS + $2)) pid
    pid="$(cat "$FW_STATE/pid")"
    while [ "$SECONDS" -lt "$deadline" ]; do
        if [ "$(redis-cli -p "$port" ping 2>/dev/null)" = "PONG" ]; then
            return 0
        fi
        _fw_alive "$pid" || break
        sleep 0.1
    done
    echo "server (pid $pid) did not answer PONG on port $port; end of its log:" >&2
    tail -n 20 "$FW_STATE/server.log" >&2
    return 1
}

# fw_free_fixed_port: a free port below the kernel's ephemeral range. While a durable
# server is down, its clients keep reconnecting; a port from the ephemeral range (what
# fw_free_port gives) can meanwhile become the local port of one of those connections
# (even a connection to itself: TCP simultaneous open), and the restart then fails with
# "Address already in use" or, worse, the client talks to itself.
fw_free_fixed_port() {
    python3 -c '
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    port = random.randrange(10000, max(lo, 10001))
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port below the ephemeral range")
'
}

fw_start_durable_server() {
    local threads="$1"; shift
    FW_STATE="$(mktemp -d -t fw-durable.XXXXXX)"
    FW_DATA_DIR="$FW_STATE/data"
    FW_LOG="$FW_STATE/server.log"
    mkdir -p "$FW_DATA_DIR"
    FW_PORT="$(fw_free_fixed_port)" || return 1
    FW_URL="redis://127.0.0.1:$FW_PORT"
    if [ "$FW_SERVER" = "redis" ]; then
        printf '%s\n' redis-server --port "$FW_PORT" --bind 127.0.0.1 --save "" \
            --dir "$FW_DATA_DIR" --appendonly yes --appendfsync always "$@" >"$FW_STATE/argv"
    else
        printf '%s\n' "$KITE_BIN" --port "$FW_PORT" --bind 127.0.0.1 --threads "$threads" --save "" \
            --dir "$FW_DATA_DIR" --appendonly yes --appendfsync always "$@" >"$FW_STATE/argv"
    fi
    export FW_STATE FW_LIB FW_PORT FW_URL
    _fw_launch
    _fw_wait_pong "$FW_PORT" 30
}

# fw_restart_durable_server: the `restart` command (see above), for a server that is down.
fw_restart_durable_server() {
    local old port deadline
    old="$(cat "$FW_STATE/pid")"
    # The old process must be gone (and its port closed) before the new one binds.
    deadline=$((SECONDS + 10))
    while _fw_alive "$old"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "restart: the server (pid $old) is still running" >&2
            return 1
        fi
        sleep 0.05
    done
    port="$(awk 'prev == "--port" {print; exit} {prev = $0}' "$FW_STATE/argv")"
    echo "--- restart after kill -9 ($(date -u +%H:%M:%S.%N)) ---" >>"$FW_STATE/server.log"
    # The data as the killed server left it (the restarted server appends to it), for a
    # look when the check fails.
    rm -rf "$FW_STATE/data-at-kill"
    cp -a "$FW_STATE/data" "$FW_STATE/data-at-kill"
    _fw_launch
    # Reading the AOF back can take a while on a slow machine; 60 s is a deadline, not
    # an expectation.
    _fw_wait_pong "$port" 60 || return 1
    cat "$FW_STATE/pid"
}

# fw_stop_durable_server [KEEP]: stops the current durable server (TERM, then KILL after
# 10 s) and removes FW_STATE unless KEEP is non-empty (a failed run keeps its data).
fw_stop_durable_server() {
    local pid deadline
    [ -n "${FW_STATE:-}" ] || return 0
    if [ -f "$FW_STATE/pid" ]; then
        pid="$(cat "$FW_STATE/pid")"
        kill "$pid" >/dev/null 2>&1 || true
        deadline=$((SECONDS + 10))
        while _fw_alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
        if _fw_alive "$pid"; then kill -9 "$pid" >/dev/null 2>&1 || true; fi
    fi
    if [ -z "${1:-}" ]; then
        rm -rf "$FW_STATE"
    fi
    FW_STATE=""
}

# fw_run_kill9 CMD...: the kill -9 durability checks (bullmq/kill9.mjs, sidekiq/kill9.rb).
# For each configuration (fw_configs), FW_KILL9_RUNS times (default 1), starts a durable
# server on a fresh data directory and runs CMD with FW_URL, FW_PORT, FW_STATE, FW_LIB and
# FW_CONFIG exported; CMD kills and restarts the server itself. A failed run keeps the
# server's log, data directory and data-at-kill/ (FW_STATE) and shows the log's end.
# Returns non-zero when any run failed.
fw_run_kill9() {
    local threads run status=0
    for threads in $(fw_configs); do
        for run in $(seq 1 "${FW_KILL9_RUNS:-1}"); do
            if [ "$FW_SERVER" = "redis" ]; then FW_CONFIG="redis-server"; else FW_CONFIG="kite --threads $threads"; fi
            export FW_CONFIG
            if ! fw_start_durable_server "$threads"; then
                status=1
                fw_log "kill9: $FW_CONFIG did not start; its log is in $FW_STATE"
                fw_stop_durable_server keep
                continue
            fi
            fw_log "kill9 against $FW_CONFIG (port $FW_PORT, data in $FW_DATA_DIR)"
            if "$@"; then
                fw_stop_durable_server
            else
                status=1
                fw_log "kill9 FAILED against $FW_CONFIG; end of the server log:"
                tail -n 20 "$FW_STATE/server.log" >&2 || true
                fw_log "server log, data directory and its copy at the kill (data-at-kill/) kept in $FW_STATE"
                fw_stop_durable_server keep
            fi
        done
    done
    return "$status"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    case "${1:-}" in
        restart)
            : "${FW_STATE:?FW_STATE is not set}"
            fw_restart_durable_server
            ;;
        *)
            echo "usage: FW_STATE=DIR bash lib.sh restart" >&2
            exit 2
            ;;
    esac
fi

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
}
trap fw_cleanup EXIT

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

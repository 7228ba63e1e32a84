#!/usr/bin/env bash
# Sentinel failover and live migration off Redis (see README.md here):
#   test_failover.py   three real Sentinels (quorum 2) watch a Kite master (--threads 4) and
#                      two Kite replicas (--threads 1 and 2); kill -9 the master under
#                      redis-py's Sentinel client (WAIT 1 after each write) and under a
#                      BullMQ producer and worker on ioredis with `sentinels`
#   test_migration.py  a producer moves from redis-server to a fresh Kite by the
#                      REPLICAOF / CLIENT PAUSE WRITE / REPLICAOF NO ONE recipe
# Installs what is missing (redis-server, node and the pinned bullmq/ioredis, redis-py and
# pytest). Extra arguments go to pytest (e.g. -k migration, -x). Environment: KITE_BIN,
# FW_SERVER=redis (run every server as redis-server: checks the tests), PY (a python with
# redis>=5 and pytest), SENTINEL_KEEP=1 (keep the servers' folders), SENTINEL_SUITE_TIMEOUT
# (seconds, default 300).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
FW_NAME=sentinel
. "$HERE/../frameworks/lib.sh"
export PYTHONDONTWRITEBYTECODE=1

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    fw_apt_install redis-server redis-tools
fi
# Sentinel: redis-sentinel when installed, else `redis-server --sentinel` (the same program).
if command -v redis-sentinel >/dev/null 2>&1; then
    fw_log "sentinel: redis-sentinel ($(redis-sentinel --version | head -n 1))"
else
    fw_log "sentinel: redis-server --sentinel ($(redis-server --version | head -n 1))"
fi
fw_npm_ci "$HERE"
if [ "$FW_SERVER" != "redis" ] && [ ! -x "$KITE_BIN" ]; then
    echo "Kite binary not found at $KITE_BIN: cargo build --release" >&2
    exit 1
fi
export KITE_BIN FW_SERVER

py_ready() {
    "$1" - >/dev/null 2>&1 <<'PY'
import pytest, redis
assert int(redis.__version__.split(".")[0]) >= 5
PY
}
if [ -z "${PY:-}" ]; then
    if py_ready python3; then
        PY=python3
    elif [ -x "$FW_ROOT/target/pytest-venv/bin/python" ] && py_ready "$FW_ROOT/target/pytest-venv/bin/python"; then
        PY="$FW_ROOT/target/pytest-venv/bin/python"
    else
        fw_python_venv sentinel "$HERE/requirements.txt"
        PY="$FW_VENV/bin/python"
    fi
fi

fw_log "pytest tests/sentinel against $([ "$FW_SERVER" = redis ] && echo redis-server || echo "$KITE_BIN")"
cd "$FW_ROOT"
timeout "${SENTINEL_SUITE_TIMEOUT:-300}" "$PY" -m pytest -v -p no:cacheprovider "$HERE" "$@"

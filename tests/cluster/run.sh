#!/usr/bin/env bash
# Cluster mode, black-box (see README.md here):
#   test_create.py  redis-cli --cluster create of 3 Kite masters (--threads 2 each), check,
#                   RedisCluster writes/reads, reshard under a writer, rebalance; 3 masters +
#                   3 replicas; SIGKILL of a master and its replica's promotion (marker
#                   `failover`)
#   test_mixed.py   a Kite node added to a cluster of redis-server nodes, slots resharded to
#                   it and back
#   test_bullmq.py  BullMQ (bullmq_cluster.mjs: producer and worker on ioredis Cluster, queue
#                   prefix in a hash tag) while the queue's slot is resharded to another
#                   master and that master is then killed with SIGKILL (marker `failover`);
#                   every acknowledged job must complete
# Installs what is missing (redis-server and redis-cli, node with the pinned bullmq 6.7.0 and
# ioredis 6.0.0 of package.json, redis-py and pytest). Extra
# arguments go to pytest (e.g. -k mixed, -x, -m 'not failover'). Environment: KITE_BIN,
# FW_SERVER=redis (run every Kite node as redis-server: checks the tests), REDIS_SERVER /
# REDIS_CLI (the Redis binaries; default: from PATH), PY (a python with redis>=5 and
# pytest), CLUSTER_KEEP=1 (keep the nodes' folders), CLUSTER_SUITE_TIMEOUT (seconds,
# default 1200).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
FW_NAME=cluster
. "$HERE/../frameworks/lib.sh"
export PYTHONDONTWRITEBYTECODE=1

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    fw_apt_install redis-server redis-tools
fi
fw_log "redis-server: $(${REDIS_SERVER:-redis-server} --version | head -n 1)"
fw_log "redis-cli: $(${REDIS_CLI:-redis-cli} --version | head -n 1)"
fw_npm_ci "$HERE"
if [ "$FW_SERVER" != "redis" ] && [ ! -x "$KITE_BIN" ]; then
    echo "Kite binary not found at $KITE_BIN: cargo build --release" >&2
    exit 1
fi
export KITE_BIN FW_SERVER

py_ready() {
    "$1" - >/dev/null 2>&1 <<'PY'
import pytest, redis
from redis.cluster import RedisCluster
assert int(redis.__version__.split(".")[0]) >= 5
PY
}
if [ -z "${PY:-}" ]; then
    if py_ready python3; then
        PY=python3
    elif [ -x "$FW_ROOT/target/pytest-venv/bin/python" ] && py_ready "$FW_ROOT/target/pytest-venv/bin/python"; then
        PY="$FW_ROOT/target/pytest-venv/bin/python"
    else
        fw_python_venv cluster "$HERE/requirements.txt"
        PY="$FW_VENV/bin/python"
    fi
fi

fw_log "pytest tests/cluster against $([ "$FW_SERVER" = redis ] && echo redis-server || echo "$KITE_BIN")"
cd "$FW_ROOT"
timeout "${CLUSTER_SUITE_TIMEOUT:-1200}" "$PY" -m pytest -v -p no:cacheprovider "$HERE" "$@"

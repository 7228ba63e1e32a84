#!/usr/bin/env bash
# Observe suite: queue tracking, KITE QUEUES, INFO queues, Prometheus /metrics and the
# dashboard (docs/observe.md), driven by real frameworks against one Kite --threads 2.
#
#   1. sidekiq   (sidekiq.rb, Ruby): 40 jobs into queue "default", 15 into "critical", 4
#                into "low" (a queue nobody serves), 5 scheduled an hour ahead, 3 parked in
#                the retry set, no Sidekiq process yet; KITE QUEUES and INFO queues show
#                depth, pushed, oldest age and the framework-wide states; then a real
#                `sidekiq -c 2` drains default and critical: depth 0, pushed == popped ==
#                enqueued, wait times, and consumers >= 1 while its fetchers idle in
#                BRPOP. That process is left running (idle) for the checks below.
#   2. bullmq    (bullmq.mjs, Node): Queue "emails" gets 50 jobs, 5 delayed an hour;
#                KITE QUEUES shows bull:emails (bullmq) with waiting 45, delayed 5; a
#                Worker (concurrency 4) runs them, 3 fail on purpose: completed 42,
#                failed 3, waiting 0, consumers >= 1 while it idles, 0 once closed.
#   3. metrics   (metrics.py, Python prometheus_client's parser): GET /metrics on the RESP
#                port; the kite_queue_* families (histogram included) agree with KITE
#                QUEUES and with what 1 and 2 did; server-wide families; /healthz, 404,
#                the JSON API, POST closed as cross-protocol scripting.
#   4. dashboard (dashboard.mjs, playwright-core driving Debian's chromium, headless):
#                GET / at 1280x800: the queue table, live update without reload after 7
#                more jobs, the page of bull:emails (by a click), dark mode, the phone
#                width (390x844, the queue page by its #/queue/ address). Screenshots in
#                target/observe-artifacts/.
# Prints a PASS/FAIL line per scenario, then one summary line per check; exits non-zero
# if any failed.
#
# `run.sh selftest` needs no Kite: it runs dashboard.mjs against a stand-in page served by
# node itself (the page contract, with fake data), which proves that chromium launches
# through playwright-core and that the dashboard checks themselves are sound.
#
# Installs what it needs (as root on a fresh Debian machine): redis-tools, Debian's
# chromium, node/npm and the pinned npm packages (bullmq, ioredis, playwright-core: no
# browser download), ruby-sidekiq and ruby-redis, Python's prometheus_client and redis
# (into $PY when it is set and pip works there, else into target/observe-venv).
#
# Environment (besides ../lib.sh's KITE_BIN and FW_SERVER):
#   PY                   a python with pip (scripts/test.sh passes its own)
#   OBS_CHROMIUM         the chromium binary (default: `command -v chromium`)
#   OBS_THREADS          Kite's --threads (default 2)
#   OBS_ARTIFACTS        where screenshots go (default target/observe-artifacts)
set -euo pipefail
FW_NAME=observe
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../lib.sh"
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

what="${1:-all}"
case "$what" in
    all | selftest) ;;
    *) echo "usage: run.sh [selftest]" >&2; exit 2 ;;
esac

if [ "$FW_SERVER" = "redis" ] && [ "$what" = all ]; then
    echo "SKIP observe: queue tracking, KITE QUEUES and /metrics are Kite's own (no redis-server mode)"
    exit 0
fi

# --- what it needs ------------------------------------------------------------------------
OBS_ARTIFACTS="${OBS_ARTIFACTS:-$FW_ROOT/target/observe-artifacts}"
mkdir -p "$OBS_ARTIFACTS"
rm -f "$OBS_ARTIFACTS"/*.png

if [ -z "${OBS_CHROMIUM:-}" ]; then
    if ! command -v chromium >/dev/null 2>&1; then
        fw_apt_install chromium
    fi
    OBS_CHROMIUM="$(command -v chromium)"
fi
fw_npm_ci "$HERE"
export OBS_CHROMIUM OBS_ARTIFACTS

if [ "$what" = selftest ]; then
    fw_log "selftest: dashboard checks against a stand-in page ($OBS_CHROMIUM)"
    timeout 120 node "$HERE/dashboard.mjs" --selftest
    exit $?
fi

command -v redis-cli >/dev/null 2>&1 || fw_apt_install redis-tools
if ! command -v sidekiq >/dev/null 2>&1 || ! ruby -e 'require "sidekiq"; require "redis"' >/dev/null 2>&1; then
    fw_apt_install ruby-sidekiq ruby-redis
fi
if [ ! -x "$KITE_BIN" ]; then
    echo "Kite binary not found at $KITE_BIN: cargo build --release" >&2
    exit 1
fi

# Python with prometheus_client and redis-py: $PY (scripts/test.sh's) when it has them or
# pip can add them, else a venv of the suite's own.
py_ready() { "$1" -c 'import prometheus_client, redis' >/dev/null 2>&1; }
OBS_PY=""
if [ -n "${PY:-}" ]; then
    if py_ready "$PY"; then
        OBS_PY="$PY"
    elif "$PY" -m pip install -q -r "$HERE/requirements.txt" >/dev/null 2>&1 && py_ready "$PY"; then
        fw_log "installed prometheus_client into $PY"
        OBS_PY="$PY"
    fi
fi
if [ -z "$OBS_PY" ]; then
    VENV="$FW_ROOT/target/observe-venv"
    stamp="$VENV/.observe-requirements"
    if ! { [ -x "$VENV/bin/python" ] && cmp -s "$HERE/requirements.txt" "$stamp" && py_ready "$VENV/bin/python"; }; then
        fw_log "installing requirements.txt into $VENV"
        mkdir -p "$FW_ROOT/target"
        if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
            rm -rf "$VENV"
            fw_apt_install python3-venv python3-pip
            python3 -m venv "$VENV"
        fi
        "$VENV/bin/python" -m pip install -q -r "$HERE/requirements.txt"
        cp "$HERE/requirements.txt" "$stamp"
    fi
    OBS_PY="$VENV/bin/python"
fi

# --- the workload's numbers (read by every step) --------------------------------------------
export OBS_SK_DEFAULT=40 OBS_SK_CRITICAL=15 OBS_SK_LOW=4 OBS_SK_SCHEDULED=5 OBS_SK_RETRY=3
export OBS_BQ_JOBS=50 OBS_BQ_DELAYED=5 OBS_BQ_FAIL=3 OBS_BQ_MORE=7
OBS_TMP="$(mktemp -d -t fw-observe.XXXXXX)"
export OBS_TMP

# The idle Sidekiq process that sidekiq.rb leaves running (pid in $OBS_TMP/sidekiq.pid).
stop_sidekiq() {
    local pid deadline
    [ -f "$OBS_TMP/sidekiq.pid" ] || return 0
    pid="$(cat "$OBS_TMP/sidekiq.pid")"
    rm -f "$OBS_TMP/sidekiq.pid"
    kill -TERM "$pid" >/dev/null 2>&1 || return 0
    deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    kill -KILL "$pid" >/dev/null 2>&1 || true
}
obs_cleanup() {
    stop_sidekiq
    fw_cleanup
    rm -rf "$OBS_TMP"
}
trap obs_cleanup EXIT
trap 'exit 130' INT TERM

threads="${OBS_THREADS:-2}"
fw_start_server "$threads"
export FW_URL FW_PORT
export FW_CONFIG="kite --threads $threads"
fw_log "$FW_CONFIG on port $FW_PORT (chromium: $OBS_CHROMIUM, python: $OBS_PY)"

summary=()
failed=0
step() {
    local name="$1" t0=$SECONDS rc=0
    shift
    fw_log "check: $name"
    "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then
        summary+=("PASS observe/$name [$FW_CONFIG] ($((SECONDS - t0)) s)")
    else
        summary+=("FAIL observe/$name [$FW_CONFIG] (exit $rc, $((SECONDS - t0)) s)")
        failed=1
    fi
}
step sidekiq timeout 120 ruby "$HERE/sidekiq.rb" "$FW_URL"
step bullmq timeout 120 node "$HERE/bullmq.mjs" "$FW_URL"
step metrics timeout 60 "$OBS_PY" "$HERE/metrics.py" "$FW_URL"
step dashboard timeout 150 node "$HERE/dashboard.mjs" "$FW_URL"
stop_sidekiq
if [ "$failed" -ne 0 ]; then
    fw_log "end of the server log:"
    tail -n 20 "$FW_LOG" >&2 || true
    if [ -f "$OBS_TMP/sidekiq.log" ]; then
        fw_log "end of the sidekiq log:"
        tail -n 20 "$OBS_TMP/sidekiq.log" >&2 || true
    fi
fi
fw_stop_server
rm -f "$FW_LOG"
printf '%s\n' "${summary[@]}"
fw_log "screenshots in $OBS_ARTIFACTS"
exit "$failed"

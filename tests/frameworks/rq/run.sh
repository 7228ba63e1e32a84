#!/usr/bin/env bash
# RQ against Kite, with real `rq worker` processes (burst and with the scheduler).
# Runs once per configuration (Kite --threads 1 and 4; FW_SERVER=redis: redis-server).
set -uo pipefail
FW_NAME=rq
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../lib.sh"

fw_python_venv rq "$HERE/requirements.txt" || exit 1

run_suite() {
    "$FW_VENV/bin/python" -m pytest -v -p no:cacheprovider "$HERE/test_rq.py" "$@"
}
fw_each_config run_suite "$@"

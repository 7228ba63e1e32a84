#!/usr/bin/env bash
# Celery (Redis broker and Redis result backend) against Kite, with real worker processes.
# Runs once per configuration (Kite --threads 1 and 4; FW_SERVER=redis: redis-server).
set -uo pipefail
FW_NAME=celery
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../lib.sh"

fw_python_venv celery "$HERE/requirements.txt" || exit 1

run_suite() {
    "$FW_VENV/bin/python" -m pytest -v -p no:cacheprovider "$HERE/test_celery.py" "$@"
}
fw_each_config run_suite "$@"

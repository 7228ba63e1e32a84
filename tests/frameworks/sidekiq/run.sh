#!/usr/bin/env bash
# Sidekiq suite: installs Debian's ruby-sidekiq and ruby-redis when missing, then runs
# suite.rb (three real sidekiq processes) against Kite --threads 1 and --threads 4
# (FW_SERVER=redis: against redis-server instead), then kill9.rb once per configuration:
# kill -9 in the middle of a workload with appendonly yes / appendfsync always, restart,
# no acknowledged job lost (FW_KILL9_RUNS=N repeats it with N seeds; KILL9_SEED=S replays
# one). `run.sh suite` or `run.sh kill9` runs one of the two. See ../lib.sh for the
# environment.
set -euo pipefail
FW_NAME=sidekiq
DIR="$(cd "$(dirname "$0")" && pwd)"
. "$DIR/../lib.sh"
if ! command -v sidekiq >/dev/null 2>&1 || ! ruby -e 'require "sidekiq"; require "redis"' >/dev/null 2>&1; then
    fw_apt_install ruby-sidekiq ruby-redis
fi
what="${1:-all}"
status=0
run() { ruby "$DIR/suite.rb" "$FW_URL"; }
if [ "$what" = all ] || [ "$what" = suite ]; then
    fw_run_configs run || status=1
fi
kill9() { timeout 180 ruby "$DIR/kill9.rb" "$FW_URL"; }
if [ "$what" = all ] || [ "$what" = kill9 ]; then
    fw_run_kill9 kill9 || status=1
fi
exit "$status"

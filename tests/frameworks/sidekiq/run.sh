#!/usr/bin/env bash
# Sidekiq suite: installs Debian's ruby-sidekiq and ruby-redis when missing, then runs
# suite.rb (three real sidekiq processes) against Kite --threads 1 and --threads 4
# (FW_SERVER=redis: against redis-server instead). See ../lib.sh for the environment.
set -euo pipefail
FW_NAME=sidekiq
DIR="$(cd "$(dirname "$0")" && pwd)"
. "$DIR/../lib.sh"
if ! command -v sidekiq >/dev/null 2>&1 || ! ruby -e 'require "sidekiq"; require "redis"' >/dev/null 2>&1; then
    fw_apt_install ruby-sidekiq ruby-redis
fi
run() { ruby "$DIR/suite.rb" "$FW_URL"; }
fw_run_configs run

#!/usr/bin/env bash
# Sidekiq drain benchmark: installs Debian's ruby-sidekiq when missing, then runs drain.rb
# with the given arguments (see drain.rb). Used by `kite-bench sidekiq-drain`.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v sidekiq >/dev/null 2>&1 || ! ruby -e 'require "sidekiq"' >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
    echo "sidekiq: apt-get install -y ruby-sidekiq" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >&2
    $SUDO apt-get install -y -qq --no-install-recommends ruby-sidekiq >&2
fi
exec ruby drain.rb "$@"

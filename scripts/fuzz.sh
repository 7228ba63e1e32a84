#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/) for a bounded time each with cargo-fuzz
# (libFuzzer, nightly Rust), after replaying the kept regression inputs. Not part of CI.
#
#   bash scripts/fuzz.sh [seconds-per-target, default 60] [target...]
#
# Installs cargo-fuzz and the nightly toolchain when missing. A crash or a timeout
# (libFuzzer's -timeout, 5 s per input: the glob target relies on it) or an allocation past
# 512 MB (a length field believed before its bytes arrived) fails the run and
# leaves the input in fuzz/artifacts/<target>/; keep it under fuzz/regressions/<target>/
# once fixed.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-60}"
shift || true
command -v rustup >/dev/null && rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo +nightly install cargo-fuzz
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=($(cargo +nightly fuzz list))
cargo +nightly fuzz build -O
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "regressions/$t"
    echo "== $t: regressions, then ${secs}s"
    if [ -n "$(ls -A "regressions/$t")" ]; then
        cargo +nightly fuzz run -O "$t" "regressions/$t" -- -runs=0 -timeout=5 -malloc_limit_mb=512 || status=1
    fi
    cargo +nightly fuzz run -O "$t" "corpus/$t" -- -max_total_time="$secs" -timeout=5 \
        -rss_limit_mb=2048 -malloc_limit_mb=512 -max_len=65536 -print_final_stats=1 2>&1 | tail -15 || status=1
done
exit "$status"

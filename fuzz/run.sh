#!/usr/bin/env bash
# Run every fuzz target for N seconds each (default 30): `fuzz/run.sh 600` for ten minutes a
# target. Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Each target
# starts from its corpus in fuzz/corpus/<target> and adds what it finds there; a crash stops
# the script with a non-zero status and leaves the input in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-30}"
cargo +nightly fuzz build
for target in $(cargo +nightly fuzz list); do
  echo "== $target: ${seconds}s"
  mkdir -p "corpus/$target"
  cargo +nightly fuzz run "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 2>&1 \
    | grep -E '^(#[0-9]+[[:space:]]+DONE|Done|stat::number_of_executed_units|==[0-9]+==|.*panicked|SUMMARY)' || true
  # `cargo fuzz run` exits non-zero on a crash; pipefail is off for grep, so check artifacts.
  if compgen -G "artifacts/$target/crash-*" >/dev/null || compgen -G "artifacts/$target/timeout-*" >/dev/null; then
    echo "fuzz target $target found a failing input: fuzz/artifacts/$target/" >&2
    exit 1
  fi
done

#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) each with libFuzzer (cargo fuzz), starting from
# the committed corpus and seeds (fuzz/seeds/, made by fuzz/make_seeds.py); new inputs that raise
# coverage land in fuzz/corpus/<target>/ (minimise with `cargo fuzz cmin` before committing),
# crashes in fuzz/artifacts/<target>/ (copy the input to
# fuzz/regressions/<target>/ with the fix, so the replay test keeps it fixed).
#   scripts/fuzz/run.sh [SECONDS] [TARGET...]
# cargo-fuzz comes from crates.io; libFuzzer's flags need RUSTC_BOOTSTRAP on a stable toolchain.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-60}"; shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(gguf openai_request kv_page chat_template)
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --version 0.13.2 >&2
fi
export RUSTC_BOOTSTRAP=1
cd fuzz
cargo fuzz build -O "${targets[@]/#/}" >/dev/null 2>&1 || true
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "seeds/$t" "artifacts/$t"
  echo "fuzzing $t for ${secs}s"
  cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- -max_total_time="$secs" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 2>&1 | tail -n 12
done

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
all=0
if [ ${#targets[@]} -eq 0 ]; then
  all=1
  targets=(gguf openai_request kv_page chat_template)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --version 0.13.2 >&2
fi
export RUSTC_BOOTSTRAP=1
cd fuzz
# `cargo fuzz build` takes one target or none (all): with none given, every target in one build;
# otherwise each `cargo fuzz run` builds its own. A failed build shows again in the run.
if [ "$all" = 1 ]; then
  cargo fuzz build -O >/dev/null 2>&1 || true
fi
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "seeds/$t" "artifacts/$t"
  echo "fuzzing $t for ${secs}s"
  cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- -max_total_time="$secs" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 2>&1 | tail -n 12
done

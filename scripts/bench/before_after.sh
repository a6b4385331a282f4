#!/usr/bin/env bash
# Two builds of tandem side by side on this machine, interleaved so the host's drift hits both
# alike: `bench engine` (32 requests x 64 in / 64 out), `bench engine` with n-gram speculation on
# the repetitive code workload (1 stream, 128 out), and `bench single` (pp512 / tg128).
#   scripts/bench/before_after.sh BEFORE_BIN AFTER_BIN [REPS]
# Prints one line per run: output tok/s and accepted draft tokens, prompt and decode tok/s.
set -euo pipefail
before="$1"; after="$2"; reps="${3:-3}"
echo "# $(lscpu | sed -n 's/^Model name: *//p'), kernel ${TANDEM_CPU_KERNEL:-auto}, $(nproc) threads"
out() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("%.1f %d" % (d["output_tok_per_s"], d["spec_accepted_tokens"]))'; }
for rep in $(seq 1 "$reps"); do
  for which in before after; do
    bin="$before"; [ "$which" = after ] && bin="$after"
    e=$("$bin" bench engine --num-prompts 32 --input-len 64 --min-input-len 64 --output-len 64 --min-output-len 64 --json 2>/dev/null | out)
    s=$("$bin" bench engine --workload code --num-prompts 1 --output-len 128 --min-output-len 128 --speculative ngram --json 2>/dev/null | out)
    one=$("$bin" bench single --prompt-tokens 512 --decode-tokens 128 2>&1 | awk '/^prompt/{p=$5}/^decode/{d=$5}END{print p, d}')
    echo "$rep $which engine_out_tok_s,accepted=$e spec_engine_out_tok_s,accepted=$s pp512,tg128_tok_s=$one"
  done
done

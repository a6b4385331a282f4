#!/usr/bin/env bash
# Tensor parallelism on this tree (two H200s): TP=2 against one GPU (tiny models, 8B shape), the
# 70B shape's decode step against the two-GPU roofline, TP=1 prefill -> TP=2 decode.
set -u
export OUT=${OUT:-/tmp/out}
bash scripts/gpu/tp.sh check 2>&1 | grep -E "^==|equal|tokens|FAIL|PASS|margin" | cut -c1-200 | tail -40
section() { echo "== $1"; timeout 400 env $2 .gpu/bin/tandem-gpu bench-decode .gpu/bin/configs/llama-3-70b.json 1,64,256 1024 2 > $OUT/tp/$1.log 2>&1; grep -E "limit:|decode llama|all-reduce" $OUT/tp/$1.log | cut -c1-220; }
section decode-llama-3-70b X=1
bash scripts/gpu/tp.sh disagg 2>&1 | tail -15
tar czf $OUT/logs.tgz -C $OUT tp $(cd $OUT && ls -d disagg 2>/dev/null)

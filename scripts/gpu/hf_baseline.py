#!/usr/bin/env python3
"""Hugging Face transformers on nano-vllm's benchmark workload, the baseline of Tandem's GPU
throughput figure: random weights of a shape (cuda/configs/qwen3-0.6b.json), 256 requests with
prompt lengths uniform in [100, 1024] (token ids uniform in [0, 10000]) and output lengths
uniform in [100, 1024], seed 0, temperature 0.6, no top-k/top-p, EOS ignored — the same lists
nano-vllm's bench.py draws with Python's `random`.

transformers batches statically: requests run in batches (sorted by prompt length to limit
padding), each batch until its longest output; only the requested output tokens count.

    python3 scripts/gpu/hf_baseline.py [--config cuda/configs/qwen3-0.6b.json] [--batch-size 128]
    python3 scripts/gpu/hf_baseline.py --dump-workload FILE   # the requests only, for
                                                               # `tandem bench engine --workload-file`

Prints one JSON line with the device name, tokens and output tokens per second.
"""
import argparse
import json
import random
import time


def workload(num_seqs=256, max_input_len=1024, max_output_len=1024):
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, max_input_len))] for _ in range(num_seqs)]
    outputs = [random.randint(100, max_output_len) for _ in range(num_seqs)]
    return prompts, outputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="cuda/configs/qwen3-0.6b.json")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--dump-workload", metavar="FILE", help="write the requests as JSON and exit")
    args = ap.parse_args()
    if args.dump_workload:
        prompts, outputs = workload(args.num_seqs)
        with open(args.dump_workload, "w") as f:
            json.dump({"prompts": prompts, "max_tokens": outputs}, f)
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(args.config) as f:
        raw = json.load(f)
    cfg = AutoConfig.for_model(raw.pop("model_type"), **{k: v for k, v in raw.items() if k != "architectures"})
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    prompts, outputs = workload(args.num_seqs)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    gen = dict(do_sample=True, temperature=0.6, top_k=0, top_p=1.0, pad_token_id=0, eos_token_id=None)

    def run(idx):
        width = max(len(prompts[i]) for i in idx)
        ids = torch.zeros((len(idx), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(idx):
            p = prompts[i]
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        n = max(outputs[i] for i in idx)
        with torch.inference_mode():
            model.generate(ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=n, min_new_tokens=n, **gen)

    run(order[:4])  # warm-up
    torch.cuda.synchronize()
    t = time.time()
    for b in range(0, len(order), args.batch_size):
        run(order[b:b + args.batch_size])
    torch.cuda.synchronize()
    secs = time.time() - t
    out_tokens = sum(outputs)
    print(json.dumps({
        "device": torch.cuda.get_device_name(0), "transformers": __import__("transformers").__version__,
        "config": args.config, "batch_size": args.batch_size, "requests": len(prompts),
        "input_tokens": sum(map(len, prompts)), "output_tokens": out_tokens, "seconds": round(secs, 2),
        "output_tok_per_s": round(out_tokens / secs, 1),
    }))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Produce Tandem's golden reference data with Hugging Face transformers.

Runs the reference implementation on the same model files the engine loads and writes
`tests/golden/*.json`. Transformers dequantises the GGUF to f32, so these are the exact-path
references. Re-run after changing prompts; the output is committed.

    python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install torch transformers gguf accelerate
    /tmp/refenv/bin/python scripts/golden/make_golden.py --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf
    /tmp/refenv/bin/python scripts/golden/make_golden.py --gemma3 PATH/gemma-3-270m-q4_k_m.gguf
    /tmp/refenv/bin/python scripts/golden/make_golden.py --more-tiny

It also creates the tiny random safetensors models under tests/data/ (Llama in f16, Qwen3 in
bf16, a small byte-level BPE tokenizer) and their golden outputs, so the safetensors loader and
the Qwen3 architecture are checked against the reference too.
"""
import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEN_TOKENS = 32
TOP_K = 5

RAW_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "#include <stdio.h>\n\nint main(void) {\n    printf(",
    "In 2024, the population grew by 1,234,567 people (about 3.5%).",
    "Les élèves français étudient la physique quantique à l'université de Genève.",
    "日本の首都は東京です。東京の人口は",
    "Emoji test: 🎉🚀 are fun. Ünïcödé àçcénts, naïve café — “quotes” and ‘apostrophes’.",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
    "   Leading spaces\tand\ttabs\n\n\nand blank lines",
]
CHAT_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the ocean."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "List three prime numbers."},
    ],
]


def greedy_with_logprobs(model, prompt_ids):
    """Greedy decoding of GEN_TOKENS tokens (EOS ignored), then one teacher-forced forward
    over prompt + generated tokens for the log-probabilities at every generated position."""
    ids = list(prompt_ids)
    with torch.no_grad():
        past = None
        inp = torch.tensor([ids])
        for _ in range(GEN_TOKENS):
            out = model(input_ids=inp, past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = int(torch.argmax(out.logits[0, -1]).item())
            ids.append(nxt)
            inp = torch.tensor([[nxt]])
        full = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(full, dim=-1)
    n = len(prompt_ids)
    steps = []
    for i in range(GEN_TOKENS):
        row = lp[n - 1 + i]
        top = torch.topk(row, TOP_K)
        steps.append({
            "token_id": ids[n + i],
            "logprob": float(row[ids[n + i]]),
            "top": [{"token_id": int(t), "logprob": float(v)} for v, t in zip(top.values, top.indices)],
        })
    return ids[n:], steps


def case(name, kind, text, prompt_ids, model, messages=None):
    gen, steps = greedy_with_logprobs(model, prompt_ids)
    c = {"name": name, "kind": kind, "prompt": text, "prompt_token_ids": prompt_ids,
         "greedy_token_ids": gen, "steps": steps}
    if messages is not None:
        c["messages"] = messages
    return c


def load_gguf(gguf_path):
    """The tokenizer and the f32 model transformers makes of a GGUF file (dequantised)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    return tok, model.eval()


def raw_cases(tok, model, prompts, bos=False):
    """A golden case per raw prompt (with the model's BOS when `bos`)."""
    cases = []
    for i, p in enumerate(prompts):
        ids = tok.encode(p, add_special_tokens=bos)
        cases.append(case(f"raw{i}", "raw", p, ids, model))
        print(f"raw{i}: {len(ids)} prompt tokens", file=sys.stderr)
    return cases


def smollm2(gguf_path):
    tok, model = load_gguf(gguf_path)
    cases = raw_cases(tok, model, RAW_PROMPTS)
    for i, msgs in enumerate(CHAT_PROMPTS):
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
        cases.append(case(f"chat{i}", "chat", text, ids, model, messages=msgs))
        print(f"chat{i}: {len(ids)} prompt tokens", file=sys.stderr)
    return {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "reference": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, float32",
            "cases": cases}


def tiny_models():
    """Tiny random Llama (f16) and Qwen3 (bf16) safetensors models with a small BPE tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM, PreTrainedTokenizerFast

    corpus = [p for p in RAW_PROMPTS] * 20 + ["the quick brown fox jumps over the lazy dog " * 5] * 20
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus, trainer)
    vocab = bpe.get_vocab_size()
    template = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    out = {}
    for name, cls, cfg_cls, dtype, extra in [
        ("tiny-llama", LlamaForCausalLM, LlamaConfig, torch.float16, {}),
        ("tiny-qwen3", Qwen3ForCausalLM, Qwen3Config, torch.bfloat16, {"head_dim": 16}),
    ]:
        torch.manual_seed(1234)
        cfg = cfg_cls(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=(name == "tiny-qwen3"),
                      bos_token_id=0, eos_token_id=2, **extra)
        model = cls(cfg)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.3)
            # Round the weights to the storage dtype so the f32 reference sees what is saved.
            model = model.to(dtype)
        d = os.path.join(ROOT, "tests", "data", name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        hf_tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", bos_token="<|endoftext|>")
        hf_tok.chat_template = template
        hf_tok.save_pretrained(d)
        model = model.to(torch.float32).eval()
        cases = raw_cases(hf_tok, model, RAW_PROMPTS[:4])
        msgs = CHAT_PROMPTS[0]
        text = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        cases.append(case("chat0", "chat", text, hf_tok.encode(text, add_special_tokens=False), model, messages=msgs))
        out[name] = {"model": f"tests/data/{name}", "reference": f"transformers float32 from {dtype}", "cases": cases}
    return out


def more_tiny_models():
    """Tiny random Qwen2 (q/k/v biases), Mistral (sliding window 16), Phi-3 (fused qkv and
    gate|up, sliding window 24) and Gemma 3 (local and global layers) in f32 safetensors, sharing tiny-llama's tokenizer; prompts long
    enough that the windows cut the context."""
    from transformers import (AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM,
                              Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM)
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tests", "data", "tiny-llama"))
    vocab = len(tok)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=2)
    out = {}
    for name, cls, cfg in [
        ("tiny-qwen2", Qwen2ForCausalLM, Qwen2Config(**common, tie_word_embeddings=True)),
        ("tiny-mistral", MistralForCausalLM, MistralConfig(**common, sliding_window=16)),
        ("tiny-phi3", Phi3ForCausalLM, Phi3Config(**common, sliding_window=24, pad_token_id=1)),
        # Two local layers (window 16) then a global one; scores scaled by 1/sqrt(24), not by
        # 1/sqrt(head_dim); norms stored as w for (1 + w).
        ("tiny-gemma3", Gemma3ForCausalLM, Gemma3TextConfig(
            **{k: v for k, v in common.items() if k not in ("rope_theta", "num_hidden_layers")},
            num_hidden_layers=3, head_dim=16, sliding_window=16, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"], pad_token_id=1)),
    ]:
        cfg._attn_implementation = "eager"
        torch.manual_seed(4321)
        model = cls(cfg)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.3)
        d = os.path.join(ROOT, "tests", "data", name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        tok.save_pretrained(d)
        model = model.float().eval()
        cases = raw_cases(tok, model, RAW_PROMPTS[:4])
        out[name] = {"model": f"tests/data/{name}", "reference": f"transformers {__import__('transformers').__version__} float32, eager attention",
                     "cases": cases}
        print(f"{name}: done", file=sys.stderr)
    return out


def gemma3(gguf_path):
    """Gemma 3 270M Q4_K_M (a base model: raw prompts, BOS prepended as the model asks)."""
    tok, model = load_gguf(gguf_path)
    cases = raw_cases(tok, model, RAW_PROMPTS, bos=True)
    return {"model": "gemma-3-270m-q4_k_m.gguf", "reference": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, float32",
            "cases": cases}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", help="path of SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--gemma3", help="path of gemma-3-270m-q4_k_m.gguf (writes its golden file only)")
    ap.add_argument("--more-tiny", action="store_true", help="only the tiny Qwen2, Mistral and Phi-3 models")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    gold = os.path.join(ROOT, "tests", "golden")
    os.makedirs(gold, exist_ok=True)
    if args.more_tiny:
        for name, data in more_tiny_models().items():
            with open(os.path.join(gold, f"{name}.json"), "w") as f:
                json.dump(data, f, ensure_ascii=False, indent=1)
        return
    if args.gemma3:
        with open(os.path.join(gold, "gemma-3-270m-q4_k_m.json"), "w") as f:
            json.dump(gemma3(args.gemma3), f, ensure_ascii=False, indent=1)
        return
    if not args.gguf:
        ap.error("--gguf or --gemma3 is required")
    with open(os.path.join(gold, "smollm2-135m-instruct-q4_1.json"), "w") as f:
        json.dump(smollm2(args.gguf), f, ensure_ascii=False, indent=1)
    for name, data in tiny_models().items():
        with open(os.path.join(gold, f"{name}.json"), "w") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()

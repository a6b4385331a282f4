"""A random Gemma 3 text model at the 270M model's widths — hidden 640, 4 query heads and 1 KV head
of width 256, MLP 2048 — with 6 layers (five local with a 512-position window, then a global
one), tests/data/tiny-llama's tokenizer, f32 safetensors. The CUDA backend's 256-wide-head path is
checked on it against the CPU exact path (`tandem-gpu e2e DIR`) on a GPU host, where the real
270M file (250 MB) cannot be carried.

    python3 scripts/gpu/make_gemma3_shape.py OUT_DIR
"""
import os
import sys

import torch
from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def main():
    out = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tests", "data", "tiny-llama"))
    cfg = Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=640, intermediate_size=2048, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=2048,
        rms_norm_eps=1e-6, sliding_window=512, query_pre_attn_scalar=256,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        bos_token_id=0, eos_token_id=2, pad_token_id=1)
    torch.manual_seed(2026)
    model = Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Norms stored as w for (1 + w); weights wide enough apart that greedy choices are
            # rarely ties.
            p.normal_(0.0, 0.1 if "norm" in name else 0.06)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(f"{out}: Gemma 3, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters", file=sys.stderr)


if __name__ == "__main__":
    main()

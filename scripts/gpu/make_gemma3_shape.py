"""A random Gemma 3 text model at the 270M model's widths — hidden 640, 4 query heads and 1 KV head
of width 256, MLP 2048 — with 6 layers (five local with a 512-position window, then a global
one), tests/data/tiny-llama's tokenizer, f32 safetensors. The CUDA backend's 256-wide-head path is
checked on it against the CPU exact path (`tandem-gpu e2e DIR`) on a GPU host, where the real
270M file (250 MB) cannot be carried.

    python3 scripts/gpu/make_gemma3_shape.py OUT_DIR
"""
import sys

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from random_shape import randomise_and_save, tokenizer


def main():
    out = sys.argv[1]
    tok = tokenizer()
    cfg = Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=640, intermediate_size=2048, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=2048,
        rms_norm_eps=1e-6, sliding_window=512, query_pre_attn_scalar=256,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        bos_token_id=0, eos_token_id=2, pad_token_id=1)
    torch.manual_seed(2026)
    model = Gemma3ForCausalLM(cfg)
    # Norms stored as w for (1 + w): drawn around 0.
    randomise_and_save(model, tok, out, "Gemma 3", 0.0, 0.1, 0.06)


if __name__ == "__main__":
    main()

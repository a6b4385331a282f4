"""A random Llama with heads of width 64 or 128 — the widths the CUDA backend's tensor-core
attention kernels (decode tiles and the flash-attention prefill kernel) take — two layers,
tests/data/tiny-llama's tokenizer, f32 safetensors. The committed tiny models have 16-wide heads,
which only the CUDA-core kernels take; `tandem-gpu e2e DIR` checks the tensor-core paths on this
one against the CPU exact path on a GPU host.

    python3 scripts/gpu/make_llama_shape.py OUT_DIR HEAD_DIM
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from random_shape import randomise_and_save, tokenizer


def main():
    out, hd = sys.argv[1], int(sys.argv[2])
    tok = tokenizer()
    # Four query heads; two KV heads at width 64 (groups of 2), one at 128 (a group of 4).
    kv = 2 if hd == 64 else 1
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=4 * hd, intermediate_size=8 * hd, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv, head_dim=hd, max_position_embeddings=2048,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(2027 + hd)
    model = LlamaForCausalLM(cfg)
    randomise_and_save(model, tok, out, f"Llama, head width {hd}", 1.0, 0.1, 0.08)


if __name__ == "__main__":
    main()

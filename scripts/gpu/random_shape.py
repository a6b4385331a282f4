"""What the random-shape model scripts (`make_gemma3_shape.py`, `make_llama_shape.py`) share:
tests/data/tiny-llama's tokenizer, and random weights saved as f32 safetensors beside it."""
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def tokenizer():
    """tests/data/tiny-llama's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.join(ROOT, "tests", "data", "tiny-llama"))


def randomise_and_save(model, tok, out, what, norm_mean, norm_std, std):
    """Draws every norm weight from N(norm_mean, norm_std) and every other weight from N(0, std)
    (wide enough apart that greedy choices are rarely ties), then saves model and tokenizer."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(norm_mean, norm_std)
            else:
                p.normal_(0.0, std)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"{out}: {what}, {params:.2f}M parameters", file=sys.stderr)

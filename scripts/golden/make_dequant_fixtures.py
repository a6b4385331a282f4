#!/usr/bin/env python3
"""Reference dequantisation of every GGUF block type Tandem loads, by the `gguf` Python package
(llama.cpp's own reader), on random blocks: writes tests/golden/dequant.json, which
engine/tests/dequant.rs checks the engine's scalar dequantiser against.

    python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install gguf numpy
    /tmp/refenv/bin/python scripts/golden/make_dequant_fixtures.py

Blocks are random bytes, with their f16 scale fields replaced by finite values of a realistic
size (random bytes would make some of them NaN or infinite); the seed is fixed.
"""
import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKS = 3

# Byte offsets of each type's f16 scale fields within its block.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def main():
    rng = np.random.default_rng(20261124)
    out = {}
    for ty, fields in F16_FIELDS.items():
        block_elems, block_bytes = __import__("gguf").GGML_QUANT_SIZES[ty]
        raw = rng.integers(0, 256, size=(BLOCKS, block_bytes), dtype=np.uint8)
        for off in fields:
            scale = rng.uniform(-0.05, 0.05, size=BLOCKS).astype(np.float16)
            raw[:, off:off + 2] = scale.view(np.uint8).reshape(BLOCKS, 2)
        values = dequantize(raw.reshape(-1), ty).astype(np.float32).reshape(-1)
        assert values.size == BLOCKS * block_elems and np.isfinite(values).all()
        out[ty.name] = {"bytes": raw.reshape(-1).tobytes().hex(), "values": [float(v) for v in values]}
    path = os.path.join(ROOT, "tests", "golden", "dequant.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"wrote {path}: {', '.join(out)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A copy of a small Llama-family model directory keeping only its first KV head (multi-query
attention): k_proj and v_proj cut to their first head's rows, `num_key_value_heads` 1, every
other file as it is. Tensor parallelism over more GPUs than a model has KV heads replicates
them; `scripts/gpu/tp.sh check` runs this copy of tests/data/tiny-llama on two GPUs.

    python3 scripts/gpu/one_kv_head.py SRC_DIR OUT_DIR

Standard library only (the safetensors layout: an 8-byte little-endian header length, a JSON
header of dtype, shape and byte offsets, then the data).
"""
import json
import pathlib
import shutil
import struct
import sys


def main() -> int:
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    raw = (src / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    new_header, chunks, offset = {}, [], 0
    for name, t in sorted(header.items(), key=lambda kv_: kv_[1]["data_offsets"][0]):
        begin, end = t["data_offsets"]
        blob = data[begin:end]
        shape = list(t["shape"])
        if name.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
            assert shape[0] == kv * hd, (name, shape)
            per_row = len(blob) // shape[0]
            shape[0] = hd
            blob = blob[: hd * per_row]
        new_header[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    if meta is not None:
        new_header["__metadata__"] = meta
    head = json.dumps(new_header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for c in chunks:
            f.write(c)
    cfg["num_key_value_heads"] = 1
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for p in src.iterdir():
        if p.name not in ("model.safetensors", "config.json") and p.is_file():
            shutil.copy(p, out / p.name)
    print(f"{out}: {heads} query heads, 1 KV head of {hd} (from {kv})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes a Llama-architecture GGUF with random Q8_0 weights from a metadata-only copy
(scripts/gpu/gguf_metadata_only.py): the model's shape, tokenizer and chat template with
weights drawn at random, so that servers that cannot generate weights themselves (llama.cpp's
llama-server) can run the same shape as `tandem ... --load-format dummy` on a host the real
file cannot reach. Throughput only: the outputs are noise (benchmarks send `ignore_eos`).
Uses no third-party package; random bytes come from os.urandom.

Usage: random_gguf.py META.gguf OUT.gguf     (then `llama-quantize --allow-requantize OUT Q4_1`)
"""
import os
import struct
import sys

from gguf_metadata_only import skip_value

F32, Q8_0 = 0, 8
ALIGN = 32


def read_meta(buf):
    """The header's version, its metadata entries as raw bytes, and the llama.* integers."""
    magic, version, tensors, kvs = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF", "not a GGUF file"
    assert tensors == 0, "expected a metadata-only file"
    at, ints = 24, {}
    for _ in range(kvs):
        (n,) = struct.unpack_from("<Q", buf, at)
        key = buf[at + 8:at + 8 + n].decode()
        at += 8 + n
        (kind,) = struct.unpack_from("<I", buf, at)
        if kind in (4, 5):  # u32, i32
            (ints[key],) = struct.unpack_from("<I", buf, at + 4)
        if key == "general.architecture":
            (m,) = struct.unpack_from("<Q", buf, at + 4)
            assert buf[at + 12:at + 12 + m] == b"llama", "only the llama architecture is written"
        at = skip_value(buf, at + 4, kind)
    return version, kvs, buf[24:at], ints


def q8_0(rows, cols):
    """Random Q8_0 data: blocks of one f16 scale and 32 int8 values (std about 0.02)."""
    assert cols % 32 == 0, f"a row of {cols} is not whole Q8_0 blocks"
    blocks = rows * cols // 32
    data = bytearray(os.urandom(blocks * 34))
    scale = struct.pack("<e", 0.02 / 74.0)  # uniform int8 has std ~74
    data[0::34] = scale[0:1] * blocks
    data[1::34] = scale[1:2] * blocks
    return bytes(data)


def tensors(ints):
    g = lambda k: ints["llama." + k]
    embd, ff, layers = g("embedding_length"), g("feed_forward_length"), g("block_count")
    heads, kv_heads, vocab = g("attention.head_count"), g("attention.head_count_kv"), g("vocab_size")
    head_dim = ints.get("llama.attention.key_length", embd // heads)
    ones = lambda n: struct.pack(f"<{n}f", *([1.0] * n))
    yield "token_embd.weight", Q8_0, (embd, vocab), lambda: q8_0(vocab, embd)
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", F32, (embd,), lambda: ones(embd)
        yield b + "attn_q.weight", Q8_0, (embd, heads * head_dim), lambda: q8_0(heads * head_dim, embd)
        yield b + "attn_k.weight", Q8_0, (embd, kv_heads * head_dim), lambda: q8_0(kv_heads * head_dim, embd)
        yield b + "attn_v.weight", Q8_0, (embd, kv_heads * head_dim), lambda: q8_0(kv_heads * head_dim, embd)
        yield b + "attn_output.weight", Q8_0, (heads * head_dim, embd), lambda: q8_0(embd, heads * head_dim)
        yield b + "ffn_norm.weight", F32, (embd,), lambda: ones(embd)
        yield b + "ffn_gate.weight", Q8_0, (embd, ff), lambda: q8_0(ff, embd)
        yield b + "ffn_up.weight", Q8_0, (embd, ff), lambda: q8_0(ff, embd)
        yield b + "ffn_down.weight", Q8_0, (ff, embd), lambda: q8_0(embd, ff)
    yield "output_norm.weight", F32, (embd,), lambda: ones(embd)


def size(kind, dims):
    n = 1
    for d in dims:
        n *= d
    return n * 4 if kind == F32 else n // 32 * 34


def main(src, dst):
    version, kvs, meta, ints = read_meta(open(src, "rb").read())
    specs = list(tensors(ints))
    info, offset = bytearray(), 0
    for name, kind, dims, _ in specs:
        k = name.encode()
        info += struct.pack("<Q", len(k)) + k + struct.pack("<I", len(dims))
        info += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset)
        offset += -(-size(kind, dims) // ALIGN) * ALIGN
    with open(dst, "wb") as f:
        f.write(struct.pack("<4sIQQ", b"GGUF", version, len(specs), kvs))
        f.write(meta)
        f.write(info)
        f.write(b"\0" * (-f.tell() % ALIGN))
        for _, kind, dims, make in specs:
            data = make()
            assert len(data) == size(kind, dims)
            f.write(data)
            f.write(b"\0" * (-len(data) % ALIGN))
    print(f"{dst}: {len(specs)} random tensors ({offset / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

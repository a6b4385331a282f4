#!/usr/bin/env python3
"""Writes a copy of a GGUF file with its metadata (architecture, shapes, tokenizer, chat
template) and no tensors: a few MB that travel to a GPU host where `tandem ... --load-format
dummy --model COPY.gguf` serves the model's shape with random weights and its real tokenizer
(structured outputs need a vocabulary).

Usage: gguf_metadata_only.py IN.gguf OUT.gguf
"""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def skip_value(buf, at, kind):
    if kind in SIZES:
        return at + SIZES[kind]
    if kind == 8:  # string
        (n,) = struct.unpack_from("<Q", buf, at)
        return at + 8 + n
    if kind == 9:  # array
        elem, count = struct.unpack_from("<IQ", buf, at)
        at += 12
        if elem in SIZES:
            return at + SIZES[elem] * count
        for _ in range(count):
            at = skip_value(buf, at, elem)
        return at
    raise ValueError(f"unknown GGUF value type {kind}")


def main(src, dst):
    buf = open(src, "rb").read()
    magic, version, tensors, kvs = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF", "not a GGUF file"
    at = 24
    keys, arch, tokens = set(), None, None
    for _ in range(kvs):
        (n,) = struct.unpack_from("<Q", buf, at)
        key = buf[at + 8:at + 8 + n].decode()
        keys.add(key)
        at += 8 + n
        (kind,) = struct.unpack_from("<I", buf, at)
        if key == "general.architecture":
            (m,) = struct.unpack_from("<Q", buf, at + 4)
            arch = buf[at + 12:at + 12 + m].decode()
        if key == "tokenizer.ggml.tokens":
            (tokens,) = struct.unpack_from("<Q", buf, at + 8)
        at = skip_value(buf, at + 4, kind)
    # The vocabulary size is otherwise read off the embedding tensor, which is left out.
    extra = b""
    vocab_key = f"{arch}.vocab_size"
    if vocab_key not in keys and tokens:
        k = vocab_key.encode()
        extra = struct.pack("<Q", len(k)) + k + struct.pack("<II", 4, tokens)
    with open(dst, "wb") as f:
        f.write(struct.pack("<4sIQQ", magic, version, 0, kvs + (1 if extra else 0)))
        f.write(buf[24:at])
        f.write(extra)
    print(f"{dst}: {kvs} metadata entries, {tensors} tensors left out, {at + len(extra)} bytes")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

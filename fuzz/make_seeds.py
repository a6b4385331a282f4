#!/usr/bin/env python3
"""Writes the seed inputs under fuzz/seeds/<target>/ (run from the repository root:
`python3 fuzz/make_seeds.py [path/to/model.gguf]`). Seeds are small valid inputs of each
format; libFuzzer mutates from there. With a model file, its first 64 KiB (header and the start
of the metadata) become a GGUF seed too."""
import json, os, struct, sys, zlib

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")

def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b

def gguf(kvs, tensors):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, typ, val in kvs:
        out += gstr(key) + struct.pack("<I", typ)
        if typ == 8:  # string
            out += gstr(val)
        elif typ == 4:  # u32
            out += struct.pack("<I", val)
        elif typ == 6:  # f32
            out += struct.pack("<f", val)
        elif typ == 9:  # array of strings
            out += struct.pack("<IQ", 8, len(val)) + b"".join(gstr(v) for v in val)
    offset = 0
    data = b""
    for name, dims, ttype, payload in tensors:
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, offset)
        data += payload
        offset += len(payload)
    out += b"\0" * ((32 - len(out) % 32) % 32)
    return out + data

llama = [
    ("general.architecture", 8, "llama"),
    ("llama.context_length", 4, 256),
    ("llama.embedding_length", 4, 8),
    ("llama.block_count", 4, 1),
    ("llama.feed_forward_length", 4, 16),
    ("llama.attention.head_count", 4, 2),
    ("llama.attention.head_count_kv", 4, 1),
    ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
    ("tokenizer.ggml.tokens", 9, ["<s>", "</s>", "a", "b"]),
    ("tokenizer.chat_template", 8, "{% for m in messages %}{{ m['content'] }}{% endfor %}"),
]
put("gguf", "tiny-llama.gguf", gguf(llama, [("token_embd.weight", [8, 4], 0, struct.pack("<32f", *([0.5] * 32)))]))
put("gguf", "metadata-only.gguf", gguf(llama[:3], []))
if len(sys.argv) > 1 and sys.argv[1]:
    with open(sys.argv[1], "rb") as f:
        put("gguf", "model-head.gguf", f.read(64 << 10))

bodies = {
    "completion.json": {"model": "m", "prompt": "Hello", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "logprobs": 2, "stop": ["\n"], "seed": 1},
    "completion-tokens.json": {"model": "m", "prompt": [[1, 2, 3], [4]], "n": 2, "stream": True, "stream_options": {"include_usage": True}},
    "chat.json": {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 3},
    "chat-tools.json": {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}], "response_format": {"type": "json_object"}},
}
for name, body in bodies.items():
    put("openai_request", name, json.dumps(body))
put("openai_request", "not-object.json", "[1, 2, 3]")

def page(tid, index, bhash, payload):
    crc = zlib.crc32(struct.pack("<QIQ", tid, index, bhash) + payload)
    return b"TKVP" + struct.pack("<QIQII", tid, index, bhash, len(payload), crc) + payload

put("kv_page", "page.bin", page(7, 0, 0x1234, bytes(range(64))))
put("kv_page", "empty-page.bin", page(1, 3, 0, b""))
mid = b"smollm2"
put("kv_page", "layout.bin", struct.pack("<I", len(mid)) + mid + bytes([0]) + struct.pack("<IIIIQ", 16, 30, 3, 64, 7))

sep_m, sep_r = "\x1e", "\x1f"
put("chat_template", "conversation.txt", sep_m.join(["system" + sep_r + "You are helpful.", "user" + sep_r + "Hi {{ there }}", "assistant" + sep_r + "Hello!", "user" + sep_r + "{% raw %}"]))
put("chat_template", "plain.txt", "What is the capital of France?")

#!/usr/bin/env python3
"""Writes the seed inputs of the gguf fuzz target into fuzz/corpus/gguf (names: SHA-1 of the bytes).

Small hand-built GGUF v3 files: every metadata value type, arrays, tensors of a few types, a
custom alignment, and damaged variants (truncated data, bad version, huge counts). Run it again
after changing it; the fuzzer grows the corpus from these.
"""
import hashlib
import os
import struct

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
        U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8
BLOCK = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q4_0: (32, 18), GGML_Q8_0: (32, 34)}


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(value(et, i) for i in items)
    return struct.pack(PACK[t], v)


def gguf(kvs, tensors, alignment=32, version=3):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += s(key) + struct.pack("<I", t) + value(t, v)
    data, infos = b"", b""
    for name, dims, gtype in tensors:
        n = 1
        for d in dims:
            n *= d
        blk, size = BLOCK[gtype]
        nbytes = n // blk * size
        infos += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", gtype, len(data))
        data += bytes((i * 7) % 251 for i in range(nbytes))
        data += b"\0" * (-len(data) % alignment)
    out += infos
    out += b"\0" * (-len(out) % alignment)
    return out + data


ALL_TYPES = [
    ("general.architecture", STR, "llama"),
    ("general.name", STR, "seed"),
    ("a.u8", U8, 200), ("a.i8", I8, -3), ("a.u16", U16, 60000), ("a.i16", I16, -300),
    ("a.u32", U32, 4000000000), ("a.i32", I32, -7), ("a.f32", F32, 0.5), ("a.bool", BOOL, True),
    ("a.u64", U64, 1 << 40), ("a.i64", I64, -(1 << 40)), ("a.f64", F64, 2.25),
    ("a.arr_u32", ARR, (U32, [1, 2, 3])),
    ("tokenizer.ggml.tokens", ARR, (STR, ["<s>", "</s>", "a", "b"])),
]
TENSORS = [("token_embd.weight", [4, 4], GGML_F32), ("blk.0.attn_q.weight", [32, 2], GGML_Q4_0),
           ("blk.0.ffn_up.weight", [32, 1], GGML_Q8_0), ("output_norm.weight", [8], GGML_F16)]

seeds = [
    gguf(ALL_TYPES, TENSORS),
    gguf([("general.architecture", STR, "qwen3")], []),
    gguf([("general.alignment", U32, 64), ("general.architecture", STR, "gemma3")], TENSORS[:2], alignment=64),
    gguf(ALL_TYPES, TENSORS)[:-40],                                   # tensor data cut short
    gguf(ALL_TYPES, TENSORS, version=1),                              # unsupported version
    gguf([("general.architecture", STR, "llama")], [("t", [1, 1, 1, 1], GGML_F32)]),
    b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 1 << 60),               # absurd counts
    b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + s("k") + struct.pack("<IIQ", ARR, U8, 1 << 62),  # huge array
]

here = os.path.dirname(os.path.abspath(__file__))
corpus = os.path.join(here, "corpus", "gguf")
os.makedirs(corpus, exist_ok=True)
for seed in seeds:
    with open(os.path.join(corpus, hashlib.sha1(seed).hexdigest()), "wb") as f:
        f.write(seed)
print(f"{len(seeds)} seeds in {corpus}")

#!/usr/bin/env python3
"""Regenerate the seed corpora under fuzz/corpus/ (small, committed). Deterministic.

    python3 fuzz/make_seeds.py

Each harness's input layout is described at the top of its fuzz_<name>.c."""
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import zckpt  # noqa: E402

CORPUS = os.path.join(HERE, "corpus")


def out(name, fname, data):
    d = os.path.join(CORPUS, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, fname), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def seeds_config():
    for f in sorted(os.listdir(os.path.join(ROOT, "tests", "configs"))):
        out("config", f, open(os.path.join(ROOT, "tests", "configs", f), "rb").read())
    small = {
        "default": {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
                    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                              "weight_decay": 0.1}},
                    "scheduler": {"type": "WarmupCosineLR",
                                  "params": {"total_num_steps": 300, "warmup_num_steps": 20, "cos_min_ratio": 0.1}},
                    "gradient_clipping": 1.0, "steps_per_print": 10, "zero_optimization": {"stage": 0},
                    "model": {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64}},
        "warmuplr": {"train_batch_size": 32, "gradient_accumulation_steps": 4,
                     "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                                  "warmup_num_steps": 1000, "warmup_type": "log"}}},
        "decay": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
                  "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10, "warmup_num_steps": 20,
                                                                    "warmup_type": "linear"}},
                  "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "hysteresis": 2}},
        "offload": {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
                    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True,
                                                                            "ratio": 0.5},
                                          "sub_group_size": 1000000000}},
        "lion": {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lion", "params": {"lr": 1e-4}}},
    }
    for k, v in small.items():
        out("config", k + ".json", json.dumps(v, indent=1))
    out("config", "syntax_error.json", '{"train_batch_size": 8,, }')
    out("config", "not_object.json", "[1, 2, 3]")


def seeds_ckpt():
    f32 = struct.pack("<6f", 1.0, -2.0, 3.5, 0.0, 1e-3, 7.0)
    ents = [
        ("wte.weight", 0, [2, 3], f32),
        ("meta", zckpt.RAW, [], b'{"format": "zoff-train-state", "version": 1, "step": 1}'),
        ("empty", 0, [0, 4], b""),
        ("h.0.ln_1.weight", 1, [4], struct.pack("<4H", 0x3F80, 0x4000, 0xBF80, 0)),
        ("scalar", 3, [], struct.pack("<i", 42)),
    ]
    tmp = os.path.join(CORPUS, ".tmp.zckpt")
    os.makedirs(CORPUS, exist_ok=True)
    for i, (flags, e) in enumerate([(0, ents), (0x0F, ents), (0, ents[:1]), (0x0F, []), (0, ents[1:2])]):
        zckpt.write_file(tmp, 1, 0, e)
        out("ckpt", "valid_%d.bin" % i, bytes([flags]) + open(tmp, "rb").read())
    # pieces of a partitioned tensor, as `zoff train` writes with several ranks (zoff_ckpt_gather)
    pieces = [("w@0/2x3", 0, [3], f32[:12]), ("w@3/2x3", 0, [3], f32[12:]), ("optimizer.exp_avg@0/6", 0, [6], f32),
              ("meta", zckpt.RAW, [], b"{}")]
    zckpt.write_file(tmp, 1, 0, pieces)
    out("ckpt", "pieces.bin", bytes([0x0F]) + open(tmp, "rb").read())
    os.remove(tmp)


def shard(tokens, vocab=0, count=None):
    h = [0] * 256
    h[0], h[1], h[2], h[3] = 20240520, 1, len(tokens) if count is None else count, vocab
    return struct.pack("<256i", *h) + struct.pack("<%dH" % len(tokens), *tokens)


def seeds_shard():
    toks = [(i * 7919) % 256 for i in range(300)]
    # params: B, T, flags (vocab bits 0-1, fix count 4, two shards 8, shuffle 16, split <<5), cut, val, seed.., state..
    def params(b, t, flags, cut=0, val=0):
        return bytes([b, t, flags, cut, val, 1, 2, 3]) + struct.pack("<ii", 0, 0)
    out("shard", "byte_all.bin", params(1, 15, 1 | 16) + shard(toks, 256))
    out("shard", "byte_train.bin", params(3, 7, 1 | (1 << 5), 0, 40) + shard(toks, 256))
    out("shard", "byte_val_two.bin", params(0, 3, 1 | 8 | 16 | (2 << 5), 50, 60) + shard(toks, 256))
    out("shard", "gpt2_noshuffle.bin", params(2, 31, 2 | 4) + shard([50256, 464, 2068, 7586] * 20, 50257))
    out("shard", "no_vocab.bin", params(0, 0, 0) + shard([65535, 0, 1, 2] * 10, 0))
    out("shard", "truncated.bin", params(0, 0, 1) + shard(toks, 256, count=400))
    out("shard", "empty.bin", params(0, 0, 1) + shard([], 256))


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def seeds_tokenizer():
    b2u = bytes_to_unicode()
    enc = {b2u[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "s"),
              ("in", "g"), ("Ġthe", "r")]
    for a, b in merges:
        enc.setdefault(a + b, len(enc))
    enc["<|endoftext|>"] = len(enc)
    bpe = "#version: 0.2\n" + "".join("%s %s\n" % m for m in merges)
    ej = json.dumps(enc, ensure_ascii=False).encode()
    out("tokenizer_tables", "mini.bin", ej + b"\0" + bpe.encode())
    out("tokenizer_tables", "mini_crlf.bin", ej + b"\0" + bpe.replace("\n", "\r\n").encode())
    out("tokenizer_tables", "bad_merge.bin", ej + b"\0" + b"#version: 0.2\nx y\n")
    texts = {
        "english": "The quick brown fox jumps over the lazy dog. It's 3:14pm, isn't it?\n",
        "code": "int main(void) {\n    return 0;   \n}\n\t\n",
        "unicode": "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600 \u0661\u0662\u0663 \u00a0x",
        "special": "<|endoftext|>Hello<|endoftext|> 's 't 're 've 'm 'll 'd  \n\n  ",
    }
    for k, v in texts.items():
        out("tokenizer_text", k + ".txt", v)
    out("tokenizer_text", "invalid_utf8.bin", b"\xff\xfe\xc3 abc \xe6\x97 \xf0\x9f\x98 \x80\x80" + bytes(range(32)))
    out("tokenizer_text", "ids.bin", struct.pack("<6i", 464, 2068, 50256, 50257, -1, 7))


def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, data bytes) in data order."""
    hdr, off = {}, 0
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def seeds_safetensors():
    f32 = lambda n, k=0.0: struct.pack("<%df" % n, *[k + 0.01 * i for i in range(n)])
    out("safetensors", "mixed.safetensors", safetensors([
        ("a", "F32", [2, 3], f32(6)), ("b", "BF16", [4], struct.pack("<4H", 0x3F80, 0, 0xBF80, 0x7F80)),
        ("c", "I64", [2], struct.pack("<2q", -1, 1 << 40)), ("empty", "F16", [0, 5], b""),
        ("d", "F64", [1], struct.pack("<d", 2.5)), ("e", "U8", [3], b"xyz")], {"format": "pt", "k": "v"}))
    out("safetensors", "no_metadata_unpadded.safetensors", safetensors([("x", "F16", [2], b"\0\x3c\0\xbc")],
                                                                       None, pad=False))
    out("safetensors", "empty.safetensors", safetensors([], {}))
    # a 1-layer GPT-2 (C 4, V 8, maxT 4) in Hugging Face's layout, and in zoff's
    L, C, V, T = 1, 4, 8, 4
    hf = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    for l in range(L):
        p = "h.%d." % l
        hf += [(p + "ln_1.weight", [C]), (p + "ln_1.bias", [C]), (p + "attn.c_attn.weight", [C, 3 * C]),
               (p + "attn.c_attn.bias", [3 * C]), (p + "attn.c_proj.weight", [C, C]), (p + "attn.c_proj.bias", [C]),
               (p + "ln_2.weight", [C]), (p + "ln_2.bias", [C]), (p + "mlp.c_fc.weight", [C, 4 * C]),
               (p + "mlp.c_fc.bias", [4 * C]), (p + "mlp.c_proj.weight", [4 * C, C]), (p + "mlp.c_proj.bias", [C])]
    hf += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    def numel(sh):
        n = 1
        for d in sh:
            n *= d
        return n
    out("safetensors", "gpt2_hf.safetensors", safetensors([(n, "F32", sh, f32(numel(sh))) for n, sh in hf],
                                                          {"format": "pt", "zoff.num_heads": "2"}))
    out("safetensors", "gpt2_hf_bf16.safetensors", safetensors(
        [("transformer." + n, "BF16", sh, b"\x80\x3f" * numel(sh)) for n, sh in hf], {"format": "pt"}))
    zo = []
    for n, sh in hf:
        if n == "wte.weight":
            sh = [128, C]
        elif n.endswith(".weight") and len(sh) == 2 and n != "wpe.weight":
            sh = [sh[1], sh[0]]
        zo.append((n, "F32", sh, f32(numel(sh))))
    out("safetensors", "gpt2_zoff.safetensors", safetensors(zo, {"format": "pt", "zoff.layout": "zoff"}))
    fx = os.path.join(ROOT, "tests", "fixtures", "safetensors_gpt2_small_expected.safetensors")
    if os.path.exists(fx):
        out("safetensors", "fixture_expected.safetensors", open(fx, "rb").read())


def main():
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    seeds_config()
    seeds_ckpt()
    seeds_shard()
    seeds_tokenizer()
    seeds_safetensors()
    n = sum(len(fs) for _, _, fs in os.walk(CORPUS))
    print("wrote %d seed files under %s" % (n, CORPUS))


if __name__ == "__main__":
    main()

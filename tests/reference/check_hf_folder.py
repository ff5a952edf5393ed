#!/usr/bin/env python3
"""Checks a HuggingFace folder as transformers' from_pretrained would read it, written from the
format's definitions and independent of meshtrain's C++ reader (json + struct, no torch).

    python3 tests/reference/check_hf_folder.py FOLDER [--same-as OTHER_FOLDER]

- config.json: the architecture (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM,
  MistralForCausalLM, MixtralForCausalLM) and the fields its config class needs; from them, the
  tensor names and shapes HF's model class has (save_pretrained drops a tied lm_head; Mixtral
  in the hub's per-expert form, block_sparse_moe.gate and experts.J.w1/w3/w2, which is what
  transformers 5's save_pretrained writes after reverting its fused experts).
- model.safetensors, or model.safetensors.index.json and its shards: every shard the index
  names exists and holds exactly the tensors the index puts there; metadata.total_size is the
  sum of the tensors' bytes; each header is 8-byte little-endian length + JSON, the data
  offsets are contiguous from 0 and end at the end of the file; dtypes F32/BF16/F16 with
  byte sizes matching the shapes.
- --same-as: the other folder holds the same tensors with the same bytes.
Prints one summary line; exits 1 with the first problem found.
"""
import argparse
import json
import os
import struct
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8}


def fail(msg):
    print("check_hf_folder: " + msg, file=sys.stderr)
    sys.exit(1)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def expected_tensors(cfg):
    arch = (cfg.get("architectures") or [""])[0]
    out = {}
    if arch == "GPT2LMHeadModel":
        C, L, V, T = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"]
        inner = cfg.get("n_inner") or 4 * C
        out["wte.weight"] = [V, C]
        out["wpe.weight"] = [T, C]
        for l in range(L):
            p = "h.%d." % l
            for n in ("ln_1", "ln_2"):
                out[p + n + ".weight"] = [C]
                out[p + n + ".bias"] = [C]
            out[p + "attn.c_attn.weight"] = [C, 3 * C]
            out[p + "attn.c_attn.bias"] = [3 * C]
            out[p + "attn.c_proj.weight"] = [C, C]
            out[p + "attn.c_proj.bias"] = [C]
            out[p + "mlp.c_fc.weight"] = [C, inner]
            out[p + "mlp.c_fc.bias"] = [inner]
            out[p + "mlp.c_proj.weight"] = [inner, C]
            out[p + "mlp.c_proj.bias"] = [C]
        out["ln_f.weight"] = [C]
        out["ln_f.bias"] = [C]
        return arch, out
    if arch not in ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM",
                    "MixtralForCausalLM"):
        fail("config.json: architecture %r is not one this check knows" % arch)
    C, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    NH = cfg["num_attention_heads"]
    mixtral = arch == "MixtralForCausalLM"
    NKV = cfg.get("num_key_value_heads") or (8 if mixtral else NH)  # MixtralConfig's default: 8
    E = cfg.get("num_local_experts", 8)
    HS = cfg.get("head_dim") or C // NH
    I = cfg["intermediate_size"]
    # Qwen2 has q/k/v biases always; Llama and Mistral when attention_bias is set.
    qkv_bias = arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False))
    tied = cfg.get("tie_word_embeddings", False)  # the config classes' default
    out["model.embed_tokens.weight"] = [V, C]
    for l in range(L):
        p = "model.layers.%d." % l
        out[p + "self_attn.q_proj.weight"] = [NH * HS, C]
        out[p + "self_attn.k_proj.weight"] = [NKV * HS, C]
        out[p + "self_attn.v_proj.weight"] = [NKV * HS, C]
        out[p + "self_attn.o_proj.weight"] = [C, NH * HS]
        if qkv_bias:
            out[p + "self_attn.q_proj.bias"] = [NH * HS]
            out[p + "self_attn.k_proj.bias"] = [NKV * HS]
            out[p + "self_attn.v_proj.bias"] = [NKV * HS]
        if mixtral:
            m = p + "block_sparse_moe."
            out[m + "gate.weight"] = [E, C]
            for e in range(E):
                out[m + "experts.%d.w1.weight" % e] = [I, C]
                out[m + "experts.%d.w3.weight" % e] = [I, C]
                out[m + "experts.%d.w2.weight" % e] = [C, I]
        else:
            out[p + "mlp.gate_proj.weight"] = [I, C]
            out[p + "mlp.up_proj.weight"] = [I, C]
            out[p + "mlp.down_proj.weight"] = [C, I]
        out[p + "input_layernorm.weight"] = [C]
        out[p + "post_attention_layernorm.weight"] = [C]
    out["model.norm.weight"] = [C]
    if not tied:
        out["lm_head.weight"] = [V, C]
    return arch, out


def read_header(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            fail("%s: shorter than its 8-byte header length" % path)
        (n,) = struct.unpack("<Q", raw)
        if 8 + n > size:
            fail("%s: header of %d bytes past the end of the file" % (path, n))
        header = json.loads(f.read(n).decode("utf-8"))
    header.pop("__metadata__", None)
    end = 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        if t["dtype"] not in SIZES:
            fail("%s: %s has dtype %s" % (path, name, t["dtype"]))
        if b != end:
            fail("%s: %s starts at %d, the previous tensor ends at %d" % (path, name, b, end))
        if e - b != numel(t["shape"]) * SIZES[t["dtype"]]:
            fail("%s: %s holds %d bytes for shape %s %s" % (path, name, e - b, t["shape"], t["dtype"]))
        end = e
    if 8 + n + end != size:
        fail("%s: data ends at %d, the file at %d" % (path, 8 + n + end, size))
    return header, 8 + n


def tensors_of(folder):
    """name -> (file, header entry, data start) for the folder's weights."""
    index = os.path.join(folder, "model.safetensors.index.json")
    found = {}
    if os.path.exists(index):
        with open(index) as f:
            idx = json.load(f)
        wm = idx["weight_map"]
        total = 0
        for shard in sorted(set(wm.values())):
            path = os.path.join(folder, shard)
            if not os.path.exists(path):
                fail("%s names shard %s, which does not exist" % (index, shard))
            header, start = read_header(path)
            listed = {n for n, s in wm.items() if s == shard}
            if set(header) != listed:
                fail("%s holds %s, the index puts %s there" % (shard, sorted(header)[:5], sorted(listed)[:5]))
            for name, t in header.items():
                found[name] = (path, t, start)
                total += t["data_offsets"][1] - t["data_offsets"][0]
        if idx.get("metadata", {}).get("total_size") != total:
            fail("%s: total_size %s, the tensors hold %d bytes" % (index, idx.get("metadata"), total))
        return found, len(set(wm.values()))
    path = os.path.join(folder, "model.safetensors")
    if not os.path.exists(path):
        fail("%s has neither model.safetensors.index.json nor model.safetensors" % folder)
    header, start = read_header(path)
    for name, t in header.items():
        found[name] = (path, t, start)
    return found, 1


def data_of(entry):
    path, t, start = entry
    b, e = t["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + b)
        return f.read(e - b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--same-as", default="")
    a = ap.parse_args()
    with open(os.path.join(a.folder, "config.json")) as f:
        cfg = json.load(f)
    arch, want = expected_tensors(cfg)
    found, shards = tensors_of(a.folder)
    names = set(found)
    if arch == "GPT2LMHeadModel":  # save_pretrained writes "transformer." prefixes, older files none
        names = {n[len("transformer."):] if n.startswith("transformer.") else n for n in found}
        found = {(n[len("transformer."):] if n.startswith("transformer.") else n): v for n, v in found.items()}
    missing, extra = sorted(set(want) - names), sorted(names - set(want))
    if missing:
        fail("%s: missing tensors %s" % (a.folder, missing[:5]))
    if extra:
        fail("%s: tensors %s are not in %s" % (a.folder, extra[:5], arch))
    dtypes = set()
    for n, shape in want.items():
        t = found[n][1]
        if t["shape"] != shape:
            fail("%s: %s has shape %s, %s needs %s" % (a.folder, n, t["shape"], arch, shape))
        dtypes.add(t["dtype"])
    torch_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if torch_dtype and {"float32": {"F32"}, "bfloat16": {"BF16"}, "float16": {"F16"}}.get(torch_dtype, dtypes) != dtypes:
        fail("config.json: torch_dtype %s, the tensors are %s" % (torch_dtype, sorted(dtypes)))
    if a.same_as:
        other, _ = tensors_of(a.same_as)
        for n, e in found.items():
            key = n if n in other else "transformer." + n
            if key not in other or data_of(other[key]) != data_of(e):
                fail("%s differs from %s in %s" % (a.folder, a.same_as, n))
    params = sum(numel(s) for s in want.values())
    print("%s: %d tensors in %d shards, %d parameters, %s" % (arch, len(want), shards, params,
                                                            "/".join(sorted(dtypes))))


if __name__ == "__main__":
    main()

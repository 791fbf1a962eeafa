#!/usr/bin/env python3
"""What a popular web calculator answers for the shipped shapes: "Can I run
this LLM?" (github.com/RahulSChand/gpu_poor), its rule for inference with
Hugging Face transformers ("inf", no quantization) as its source states it
(`getAllComputedData`, `getParseConfig`, `computeModelSize`,
`convertToMBModelSize` and `computeInferenceOnlyActivationMemory` in
src/App.js at commit 05d18ab8f093659c1689d93a66d549032e87c5ae), applied to
the same config.json fields vramlab's planner ships
(crates/hf/src/known.json). Its MB are MiB; each part is rounded up
as its page shows it. The batch does not enter its inference rule, and its
KV cache counts every attention head (no grouped-query attention).

    python3 tests/reference/calculator_anchors.py > tests/reference/calculator_anchors.json

The question matches the README's table: bfloat16, a 512-token prompt and
256 new tokens, so a context of 768.
"""
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
KNOWN = os.path.join(HERE, "..", "..", "shared", "src", "train", "hf", "known.json")
CONTEXT = 512 + 256
MIB = 1024 * 1024
OVERHEAD_MB = 650  # "cuda + other overhead"


def key(config, names, default):
    """The first of `names` the config has (getKey)."""
    return next((config[n] for n in names if n in config), default)


def parsed(config):
    hidden = key(config, ["hidden_size", "d_model", "n_embd"], 768)
    return {
        "vocab": key(config, ["vocab_size"], 32000),
        "hidden": hidden,
        "heads": key(config, ["num_attention_heads", "num_heads", "n_head"], 12),
        "inter": key(config, ["intermediate_size", "n_inner", "d_ff"], hidden * 4),
        "layers": key(config, ["num_layers", "num_hidden_layers", "n_layer"], 12),
    }


def answer(config):
    p = parsed(config)
    h, layers = p["hidden"], p["layers"]
    parameters = p["vocab"] * h * 2 + layers * 4 * h * h + layers * 3 * p["inter"] * h
    model_mb = parameters * 2 / MIB
    kv_mb = 2 * CONTEXT * 2 * 2 * h * layers / MIB
    activation_mb = (CONTEXT * h * 5 * 2 + CONTEXT * CONTEXT * p["heads"] * 2) / MIB
    total_mb = kv_mb + model_mb + OVERHEAD_MB + activation_mb
    return {
        "parameters": parameters,
        "total_mb": math.ceil(total_mb),
        "kv_cache_mb": math.ceil(kv_mb),
        "model_mb": math.ceil(model_mb),
        "activation_mb": math.ceil(activation_mb),
        "overhead_mb": OVERHEAD_MB,
    }


def main():
    with open(KNOWN) as f:
        known = json.load(f)
    rows = [{"name": m["name"], **answer(m["config"])} for m in known]
    print(json.dumps({"calculator": "gpu_poor", "commit": "05d18ab8f093659c1689d93a66d549032e87c5ae",
                      "context": CONTEXT, "models": rows}, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What one training step allocates and frees, op by op, on the CPU, when
`scaled_dot_product_attention` runs its math kernel
(`_scaled_dot_product_attention_math`, a composite of aten ops, the same on
every device) with grouped-query heads (`enable_gqa=True`, the keys and
values repeated): what CUDA runs for float32 attention where the
memory-efficient kernel refuses grouped heads (PyTorch 2.11, as an H100
ran QLoRA's float32 activations). Small Llama, Mistral and Qwen3 models in
float32, with and without non-reentrant checkpointing and peft's LoRA,
`sdpa_kernel(SDPBackend.MATH)`; the second step is traced.

    python3 tests/reference/hf_math.py > tests/reference/hf_math.json

Needs PyTorch, transformers and peft (CPU builds; versions written in the output).
"""
import json
import sys

import peft
import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel

from hf_generate import CONFIGS
from hf_train import BATCH, SEQ, build
from step_trace import Live

MODELS = ("llama", "mistral", "qwen3")
CASES = [dict(model=m, dtype="float32", attn="sdpa", checkpointing=c, lora=l)
         for m in MODELS for c in (False, True) for l in (0, 4)]


def run(case):
    model, vocab = build(case)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, vocab, (BATCH, SEQ))
    live = Live()
    with sdpa_kernel(SDPBackend.MATH):
        for traced in (False, True):
            if traced:
                live.__enter__()
                before = live.live
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
        live.__exit__(None, None, None)
    return {**case, "kernel": "math", "batch": BATCH, "seq": SEQ, "peak": live.peak - before,
            "after": live.live - before, "events": live.ops}


def main():
    rows = [run(case) for case in CASES]
    for r in rows:
        print({k: r[k] for k in ("model", "checkpointing", "lora", "peak")}, file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "configs": {m: CONFIGS[m] for m in MODELS},
                      "cases": rows}))


if __name__ == "__main__":
    main()

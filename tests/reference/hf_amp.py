#!/usr/bin/env python3
"""What one training step of a Hugging Face transformers model allocates
and frees under `torch.autocast('cuda', dtype=torch.bfloat16)` (the
weights in float32, as `Trainer(bf16=True)` trains them), op by op, on the
CPU with CUDA's autocast policy installed (`cuda_autocast.py`), for the
small models `hf_train.py` traces: eager and sdpa attention, with and
without non-reentrant gradient checkpointing and peft's LoRA. The loss is
computed inside the autocast region, `backward()` outside it, as
`Trainer` does; the second step is traced.

    python3 tests/reference/hf_amp.py > tests/reference/hf_amp.json

Needs PyTorch, transformers and peft (CPU builds; versions written in the output).
"""
import json
import sys

import peft
import torch
import transformers

from hf_generate import CONFIGS
from hf_train import BATCH, SEQ, build, two_steps

MODELS = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
CASES = [dict(model=m, dtype="float32", attn=a, checkpointing=c, lora=l)
         for m in MODELS for a in ("eager", "sdpa") for c in (False, True) for l in (0, 4)]


def run(case):
    model, vocab = build(case)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, vocab, (BATCH, SEQ))
    return {**case, "amp": "bfloat16", **two_steps(model, opt, ids, amp="bfloat16")}


def main():
    rows = []
    for case in CASES:
        try:
            rows.append(run(case))
        except (ValueError, RuntimeError, NotImplementedError) as e:  # a pairing refused
            rows.append({**case, "error": str(e).split(". ")[0]})
            continue
        print(case, rows[-1]["peak"], file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "configs": {m: CONFIGS[m] for m in MODELS},
                      "cases": rows}))


if __name__ == "__main__":
    main()

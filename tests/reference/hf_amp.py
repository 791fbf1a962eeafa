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

import step_trace
from hf_train import BATCH, SEQ, build
from hf_generate import CONFIGS
from step_trace import Live

MODELS = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
CASES = [dict(model=m, dtype="float32", attn=a, checkpointing=c, lora=l)
         for m in MODELS for a in ("eager", "sdpa") for c in (False, True) for l in (0, 4)]


def run(case):
    model, vocab = build(case)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, vocab, (BATCH, SEQ))
    live = Live()
    marks = {}

    def step(traced):
        with step_trace.autocast("bfloat16"):
            loss = model(input_ids=ids, labels=ids).loss
        if traced:
            marks["forward_end"] = len(live.ops)
        loss.backward()
        if traced:
            marks["backward_end"] = len(live.ops)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    step(False)
    with live:
        before = live.live
        step(True)
    return {**case, "amp": "bfloat16", "batch": BATCH, "seq": SEQ, "peak": live.peak - before,
            "after": live.live - before, **marks, "events": live.ops}


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

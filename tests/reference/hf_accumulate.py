#!/usr/bin/env python3
"""What a training step of a Hugging Face transformers model allocates and
frees, op by op, on the CPU, when the parameters' gradients already exist:
the step before it ended with `zero_grad(set_to_none=False)`, so its
gradients stay (zeroed) and this step's backward adds into them, as a
step that accumulates over micro-batches does after its first. Small models
of three families in float32 with sdpa, with and without non-reentrant
checkpointing and peft's LoRA (r=4). The traced step is
`model(input_ids=ids, labels=ids).loss`, `backward()`, AdamW's `step()`,
`zero_grad(set_to_none=False)`, in the format of `hf_train.py`.

    python3 tests/reference/hf_accumulate.py > tests/reference/hf_accumulate.json

Needs PyTorch, transformers and peft (CPU builds; versions written in the output).
"""

import json
import sys

import peft
import torch
import transformers

from hf_train import BATCH, MODELS, SEQ, build, two_steps

CASES = [dict(model=m, dtype="float32", attn="sdpa", checkpointing=c, lora=l)
         for m in ("llama", "gpt2", "qwen3") for c in (False, True) for l in (0, 4)]


def run(case):
    model, vocab = build(case)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, vocab, (BATCH, SEQ))
    return {**case, **two_steps(model, opt, ids, set_to_none=False)}


def main():
    rows = [run(case) for case in CASES]
    for r in rows:
        print(r["model"], r["checkpointing"], r["lora"], r["peak"], r["after"], file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "configs": {m: MODELS[m] for m in ("llama", "gpt2", "qwen3")},
                      "cases": rows}))


if __name__ == "__main__":
    main()

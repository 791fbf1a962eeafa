#!/usr/bin/env python3
"""Where a `forward` statement's batch dies in real PyTorch:
`loss = F.cross_entropy(model(x.cuda()), y.cuda())`, then `loss.backward()`,
the copies held by nothing but the graph. Prints, for each model, the events
just before each copy's storage is freed, and where the forward statement
ended. vramlab's step programs mark the same moments (`Op::Release` in
`crates/train/src/kinds/step.rs`): the targets at NLL's backward, the token
ids after the token embedding's backward (never saved by LoRA's frozen
embedding: they die with the statement), the images after the first
convolution's backward (checkpointed or not).

    python3 tests/reference/statement_check.py

Checked with PyTorch 2.15.0 (CPU build), Python 3.11.7.
"""
import os
import sys
import weakref

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from step_trace import Gpt, Live, cnn_model  # noqa: E402


def run(name, build, batch_of, flat):
    torch.manual_seed(0)
    model = build()
    x, y = batch_of()
    mode = Live()
    with mode:
        xc, yc = x.clone(), y.clone()
        weakref.finalize(xc.untyped_storage(), lambda: mode.ops.append(["X-FREED", 0]))
        weakref.finalize(yc.untyped_storage(), lambda: mode.ops.append(["Y-FREED", 0]))
        logits = model(xc) if not flat else model(xc).flatten(0, 1)
        loss = F.cross_entropy(logits, yc.flatten())
        del logits, xc, yc
        mode.ops.append(["FORWARD-END", 0])
        loss.backward()
    print(name)
    for i, (op, _) in enumerate(mode.ops):
        if op.endswith("FREED"):
            print("  ", op, "after", mode.ops[max(0, i - 3):i])


def tokens():
    return torch.randint(0, 100, (4, 32)), torch.randint(0, 100, (4, 32))


def images():
    return torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))


if __name__ == "__main__":
    run("transformer", lambda: Gpt(2, 64, 4, 32, 100, False, False), tokens, True)
    run("transformer, checkpointed", lambda: Gpt(2, 64, 4, 32, 100, False, True), tokens, True)
    run("transformer, LoRA", lambda: Gpt(2, 64, 4, 32, 100, False, False, lora_rank=4), tokens, True)
    shape = dict(channels=3, image_size=16, blocks=2, width=8, classes=10)
    for ck in (False, True):
        run(f"cnn, checkpointed={ck}", lambda: cnn_model(checkpointing=ck, **shape), images, False)

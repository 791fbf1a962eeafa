#!/usr/bin/env python3
"""What a forward statement under `torch.no_grad()` allocates and frees in
real PyTorch, op by op: `with torch.no_grad(): loss = F.cross_entropy(
model(x), y)` (then `del logits`), under autocast as CUDA runs it when
asked, the batch already on the device, recorded as `step_trace.py`
records a training step. Nothing is saved: each tensor dies after its last
use, the block inputs as the next block returns, every autocast cast when
the region exits; `checkpoint` under no_grad runs the block plainly.

    python3 tests/reference/no_grad_trace.py > tests/reference/no_grad_trace.json

Needs PyTorch (a CPU build is enough).
"""
import json
import os
import platform
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from step_trace import BLOCK, Live, autocast, run  # noqa: E402

GPT = dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000)
MLP = dict(layers=3, width=128, input_dim=784, classes=10)
CNN = dict(channels=3, image_size=32, blocks=3, width=32, classes=10)

CASES = [
    ("transformer", dict(GPT, fused=False, checkpointing=False), dict(batch=4)),
    ("transformer", dict(GPT, fused=True, checkpointing=False), dict(batch=4)),
    ("transformer", dict(GPT, fused=False, checkpointing=True), dict(batch=4)),
    ("transformer", dict(GPT, fused=False, checkpointing=False), dict(batch=4, amp="float16")),
    ("transformer", dict(GPT, fused=False, checkpointing=False), dict(batch=4, amp="bfloat16")),
    ("transformer", dict(GPT, fused=True, checkpointing=False), dict(batch=4, amp="float16")),
    ("transformer", dict(GPT, fused=False, checkpointing=False, lora_rank=8), dict(batch=4)),
    ("transformer", dict(GPT, fused=True, checkpointing=False, lora_rank=8), dict(batch=4, amp="bfloat16")),
    ("cnn", dict(CNN), dict(batch=16)),
    ("cnn", dict(CNN), dict(batch=16, amp="float16")),
    ("mlp", dict(MLP), dict(batch=32)),
    ("mlp", dict(MLP), dict(batch=32, amp="bfloat16")),
]


def trace(build, batch_of, flat, amp=None, accumulate=1):
    torch.manual_seed(0)
    model = build()
    x, y = batch_of()
    mode = Live()
    with mode:
        with torch.no_grad(), autocast(amp):
            logits = model(x) if not flat else model(x).flatten(0, 1)
            loss = F.cross_entropy(logits, y.flatten())
            del logits
        end, events = mode.live, list(mode.ops)
    del loss
    return {"peak_bytes": mode.peak, "net_bytes": end, "events": events}


if __name__ == "__main__":
    print(json.dumps({
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": "cpu",
        "block_bytes": BLOCK,
        "steps": [{"kind": k, **shape, **data, **run(k, shape, data, trace)} for k, shape, data in CASES],
    }))

#!/usr/bin/env python3
"""Real memory snapshots of a short training run on a CUDA GPU, written by
PyTorch itself (`torch.cuda.memory._record_memory_history` +
`_dump_snapshot`): three steps of vramlab's transformer (step_trace.py's
Gpt, 4 x 256, sequence 256, batch 8, Adam), then, under a per-process
memory fraction, a batch that does not fit: the recording ends with the
out-of-memory. Run it with and without
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.

    python3 tests/reference/gpu_snapshot.py OUT.pickle
"""
import os
import pickle
import sys

import torch
import torch.nn.functional as F

import cuda_events

cuda_events.without_cpu_autocast()
from step_trace import Gpt  # noqa: E402


def main(path):
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    vocab, seq = 8000, 256
    model = Gpt(layers=4, width=256, heads=8, seq_len=seq, vocab=vocab, fused=True, checkpointing=False).cuda()
    opt = torch.optim.Adam(model.parameters())

    def step(batch):
        x = torch.randint(0, vocab, (batch, seq), device="cuda")
        loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(3):
        step(8)
    # 2 GiB for this process; a batch of 512 needs its 4 GiB of logits.
    torch.cuda.set_per_process_memory_fraction(2 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    try:
        step(512)
    except torch.OutOfMemoryError as e:
        print("out of memory, as planned:", str(e).splitlines()[0], file=sys.stderr)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "wb") as f:
        pickle.dump(relative(snapshot), f)  # as _dump_snapshot writes it


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def relative(value):
    """The snapshot with the repository's files named from its root."""
    if isinstance(value, dict):
        if isinstance(value.get("filename"), str) and value["filename"].startswith(ROOT):
            value["filename"] = value["filename"][len(ROOT):]
        for v in value.values():
            relative(v)
    elif isinstance(value, list):
        for v in value:
            relative(v)
    return value


if __name__ == "__main__":
    main(sys.argv[1])

#!/usr/bin/env python3
"""What a training step of each model kind allocates and frees in real
PyTorch, op by op: every tensor an aten op creates (its bytes, rounded up to
the caching allocator's 512-byte blocks) and the moment its storage dies,
recorded with a TorchDispatchMode on the CPU, with the peak of live bytes.
These are tensor lifetimes, not allocator blocks: no caching, no segments,
no cuBLAS or cuDNN workspaces (those are the simulator's own rules). On a
GPU the same ops run, except where a kernel is picked by device: scaled
dot-product attention here uses the CPU's flash kernel, which, like the
CUDA ones, saves the log-sum-exp and no S x S matrix.

    python3 tests/reference/step_trace.py > tests/reference/step_trace.json

Needs PyTorch (a CPU build is enough).
"""
import contextlib
import math
import os
import json
import platform
import sys
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from cuda_autocast import Autocast, emulate
from param_counts import cnn, mlp, with_lora

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vramlab_models"))
from vramlab.models import CausalSelfAttention  # noqa: E402

BLOCK = 512


def rounded(n):
    return (n + BLOCK - 1) // BLOCK * BLOCK


class Live(TorchDispatchMode):
    """Counts the bytes of live storages: each new storage when an op
    returns it, until the storage is freed."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.ops = 0, 0, []
        self.seen = set()

    def track(self, t, op):
        if not isinstance(t, torch.Tensor):
            return
        s = t.untyped_storage()
        key = s.data_ptr()
        if key in self.seen or s.nbytes() == 0:
            return
        self.seen.add(key)
        size = rounded(s.nbytes())
        self.live += size
        self.peak = max(self.peak, self.live)
        self.ops.append([op, size])

        def gone(key=key, size=size):
            self.seen.discard(key)
            self.live -= size
            self.ops.append(["free", -size])

        weakref.finalize(s, gone)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {
            t.untyped_storage().data_ptr()
            for t in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        out = emulate(func, args, kwargs)
        out = func(*args, **kwargs) if out is None else out
        for t in out if isinstance(out, (tuple, list)) else [out]:
            # A view or an in-place op returns storage it was given.
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.track(t, func.__name__)
        return out


class Attention(CausalSelfAttention):
    def __init__(self, width, heads, fused):
        super().__init__(width, heads)
        self.fused = fused

    def forward(self, x):
        return self.attend(x, self.fused)


class Block(nn.Module):
    def __init__(self, width, heads, fused):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, fused)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, layers, width, heads, seq_len, vocab, fused, checkpointing, lora_rank=0):
        super().__init__()
        self.checkpointing = checkpointing
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.h = nn.ModuleList(Block(width, heads, fused) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        if lora_rank:
            with_lora(self, lora_rank)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.lm_head(self.ln_f(x))


class CheckpointedCnn(nn.Module):
    """The CNN with each Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d block
    under `checkpoint(block, x, use_reentrant=False)`; its parameters in
    the plain CNN's order."""

    def __init__(self, **shape):
        super().__init__()
        mods = list(cnn(**shape))
        self.blocks = nn.ModuleList(nn.Sequential(*mods[i:i + 4]) for i in range(0, len(mods) - 2, 4))
        self.head = nn.Sequential(*mods[-2:])

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


class CheckpointedMlp(nn.Module):
    """The MLP under `checkpoint_sequential(model, segments, x,
    use_reentrant=False)` with about the square root of its hidden layers
    as segments (the last segment runs plainly, as the function does)."""

    def __init__(self, **shape):
        super().__init__()
        self.seq = mlp(**shape)
        self.segments = math.ceil(math.sqrt(shape["layers"]))

    def forward(self, x):
        return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)


def mlp_model(checkpointing=False, half=False, **shape):
    model = CheckpointedMlp(**shape) if checkpointing else mlp(**shape)
    return model.half() if half else model


def cnn_model(checkpointing=False, **shape):
    return CheckpointedCnn(**shape) if checkpointing else cnn(**shape)


AUTOCAST = Autocast(half=True)


def autocast(amp):
    """`torch.autocast('cuda', dtype=amp)` as CUDA runs it (see
    cuda_autocast.py), or nothing."""
    if amp is None:
        return contextlib.nullcontext()
    AUTOCAST.half = amp == "float16"
    return torch.autocast("cpu", dtype=torch.bfloat16)


def divided(loss, accumulate):
    return loss / accumulate if accumulate > 1 else loss


def trace(build, batch_of, flat, amp=None, accumulate=1):
    """Two steps of a training loop (`loss = criterion(model(x), y)`, the
    batch already on the device, Adam as on a GPU: foreach); the second is
    reported, from its start: Adam's state exists, and the first step's loss
    lives until the second one's is assigned, as in any loop. With
    `accumulate`, each step runs that many micro-batches of `loss =
    criterion(...) / accumulate`."""
    torch.manual_seed(0)
    model = build()
    x, y = batch_of()
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    mode = Live()
    with mode:
        for s in range(2):
            if s == 1:
                start, mode.peak, first = mode.live, mode.live, len(mode.ops)
            for _ in range(accumulate):
                with autocast(amp):
                    logits = model(x) if not flat else model(x).flatten(0, 1)
                    # One statement: the last loss dies when the new one is bound.
                    loss = divided(F.cross_entropy(logits, y.flatten()), accumulate)
                    del logits
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        end = mode.live
    return {"peak_bytes": mode.peak - start, "net_bytes": end - start, "events": mode.ops[first:]}


CASES = [
    ("mlp", dict(layers=2, width=128, input_dim=784, classes=10), dict(batch=32)),
    ("cnn", dict(channels=3, image_size=32, blocks=3, width=32, classes=10), dict(batch=16)),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=False), dict(batch=4)),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=True, checkpointing=False), dict(batch=4)),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=True), dict(batch=4)),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=False, lora_rank=8), dict(batch=4)),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=True, checkpointing=False, lora_rank=8), dict(batch=4)),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=True, lora_rank=8), dict(batch=4)),
    ("mlp", dict(layers=2, width=128, input_dim=784, classes=10), dict(batch=32, amp="float16")),
    ("cnn", dict(channels=3, image_size=32, blocks=3, width=32, classes=10), dict(batch=16, amp="float16")),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=False), dict(batch=4, amp="float16")),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=False), dict(batch=4, amp="bfloat16")),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=True, checkpointing=False), dict(batch=4, amp="float16")),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=True), dict(batch=4, amp="float16")),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=False, lora_rank=8), dict(batch=4, amp="float16")),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=True, checkpointing=False, lora_rank=8), dict(batch=4, amp="bfloat16")),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=True, lora_rank=8), dict(batch=4, amp="float16")),
    ("cnn", dict(channels=3, image_size=32, blocks=3, width=32, classes=10, checkpointing=True), dict(batch=16)),
    ("cnn", dict(channels=3, image_size=32, blocks=3, width=32, classes=10, checkpointing=True), dict(batch=16, amp="float16")),
    ("mlp", dict(layers=3, width=128, input_dim=784, classes=10, checkpointing=True), dict(batch=32)),
    ("mlp", dict(layers=4, width=128, input_dim=784, classes=10, checkpointing=True), dict(batch=32)),
    ("mlp", dict(layers=9, width=64, input_dim=100, classes=10, checkpointing=True), dict(batch=32, amp="float16")),
    ("mlp", dict(layers=2, width=128, input_dim=784, classes=10, half=True), dict(batch=32)),
    ("mlp", dict(layers=2, width=128, input_dim=784, classes=10), dict(batch=32, amp="float16", accumulate=2)),
]


def run(kind, shape, data, trace=trace):
    """The case's model and batch, recorded by `trace` (a training step;
    `no_grad_trace.py` passes its forward under no_grad)."""
    b, amp = data["batch"], data.get("amp")
    if kind == "mlp":
        dtype = torch.half if shape.get("half") else torch.float
        return trace(lambda: mlp_model(**shape), lambda: (torch.randn(b, shape["input_dim"], dtype=dtype), torch.randint(0, shape["classes"], (b,))), False, amp, data.get("accumulate", 1))
    if kind == "cnn":
        s = shape["image_size"]
        return trace(lambda: cnn_model(**shape), lambda: (torch.randn(b, shape["channels"], s, s), torch.randint(0, shape["classes"], (b,))), False, amp)
    s, v = shape["seq_len"], shape["vocab"]
    return trace(lambda: Gpt(**shape), lambda: (torch.randint(0, v, (b, s)), torch.randint(0, v, (b, s))), True, amp)


if __name__ == "__main__":
    print(json.dumps({
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": "cpu",
        "block_bytes": BLOCK,
        "steps": [{"kind": k, **shape, **data, **run(k, shape, data)} for k, shape, data in CASES],
    }))

#!/usr/bin/env python3
"""Checks cuda_autocast.py against CUDA's real autocast kernels: a forward
pass under `torch.autocast('cuda')` on fake CUDA tensors (FakeTensorMode
dispatches through the AutocastCUDA kernels without a GPU) must allocate
the same tensors, op by op (name, shape, element size), as the same pass on
the CPU with CUDA's policy installed. Fake tensors cannot run backward (the
autograd engine asks the driver for a device) and pick no fused attention
kernel, so those are left to step_trace.py. cuDNN's batch norm is named
`cudnn_batch_norm` on CUDA; its extra reserve tensor is empty.

    python3 tests/reference/autocast_check.py

Needs PyTorch (a CPU build with CUDA's headers, as the wheels ship).
"""
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import step_trace as st


class Ops(TorchDispatchMode):
    """Every tensor with storage an op creates: (op, shape, bytes each)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.__name__.startswith("prim"):
            return func(*args, **kwargs)
        out = st.emulate(func, args, kwargs)
        out = func(*args, **kwargs) if out is None else out
        inputs = {t.untyped_storage()._cdata for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            s = t.untyped_storage() if isinstance(t, torch.Tensor) else None
            if s is not None and s._cdata not in inputs and s.nbytes():
                name = func.__name__.split(".")[0].replace("_for_cpu", "").replace("cudnn_batch_norm", "native_batch_norm")
                self.ops.append((name, tuple(t.shape), t.dtype.itemsize))
        return out


def build(kind):
    if kind == "mlp":
        return st.mlp(layers=2, width=128, input_dim=784, classes=10), torch.randn(32, 784)
    if kind == "cnn":
        return st.cnn(channels=3, image_size=32, blocks=3, width=32, classes=10), torch.randn(16, 3, 32, 32)
    gpt = st.Gpt(layers=2, width=128, heads=4, seq_len=256, vocab=1000, fused=False, checkpointing=False, lora_rank=8 if kind == "lora" else 0)
    return gpt, torch.randint(0, 1000, (4, 256))


def on_fake_cuda(kind, dtype):
    with FakeTensorMode():
        torch.set_default_device("cuda")
        model, x = build(kind)
        torch.set_default_device(None)
        # torch.autocast('cuda') refuses without a driver; set its state.
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", dtype)
        torch.autocast_increment_nesting()
        with Ops() as ops:
            model(x)
        torch.autocast_decrement_nesting()
        torch.set_autocast_enabled("cuda", False)
        torch.clear_autocast_cache()
    return ops.ops


def on_the_cpu(kind, dtype):
    st.AUTOCAST.half = dtype == torch.float16
    model, x = build(kind)
    with Ops() as ops, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    return ops.ops


if __name__ == "__main__":
    failed = False
    for kind in ["mlp", "cnn", "eager", "lora"]:
        for dtype in [torch.float16, torch.bfloat16]:
            cuda, cpu = on_fake_cuda(kind, dtype), on_the_cpu(kind, dtype)
            same = cuda == cpu
            failed |= not same
            print(f"{kind} {dtype}: {len(cuda)} tensors, {'same' if same else 'DIFFERENT'}")
    sys.exit(1 if failed else 0)

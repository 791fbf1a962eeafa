#!/usr/bin/env python3
"""What `total_loss += loss` and `losses.append(loss)` keep alive in real
PyTorch, against `total_loss += loss.item()`: the live tensors (and their bytes, rounded up
to the caching allocator's 512-byte blocks) after 100 and after 200 steps of
a training loop, `loss.backward()` before the sum. Recorded with a
TorchDispatchMode on the CPU: autograd frees a graph's saved tensors the same
way on every device.

    python3 tests/reference/loss_history.py > tests/reference/loss_history.json

Needs PyTorch (a CPU build is enough).
"""
import gc
import json
import platform
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

BLOCK = 512


class Live(TorchDispatchMode):
    """The storages ops made that are still alive, with their bytes."""

    def __init__(self):
        super().__init__()
        self.live = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                key = s.data_ptr()
                if key not in self.live and s.nbytes():
                    self.live[key] = (s.nbytes() + BLOCK - 1) // BLOCK * BLOCK
                    weakref.finalize(s, self.live.pop, key, None)
        return out


def run(history):
    """200 steps of the loop; the live tensors after 100 and after 200."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    total_loss, losses = 0, []
    seen = []
    mode = Live()
    with mode:
        for step in range(1, 201):
            x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if history == "item":
                total_loss += loss.item()
            elif history == "tensor":
                total_loss += loss
            else:
                losses.append(loss)
            if step in (100, 200):
                gc.collect()
                seen.append({"steps": step, "tensors": len(mode.live), "bytes": sum(mode.live.values())})
    return seen


if __name__ == "__main__":
    print(json.dumps({
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": "cpu",
        "loop": "MLP 784-128-128-10, SGD, batch 32, loss.backward() then the sum",
        "item": run("item"),
        "tensor": run("tensor"),
        "list": run("list"),
    }, indent=1))

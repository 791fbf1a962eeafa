#!/usr/bin/env python3
"""What `optimizer.step()` allocates and frees in real PyTorch, op by op, at
the first step (the optimizer makes its state) and at the second, for each
optimizer vramlab models, over an MLP whose first layer is frozen (its
parameters get no `.grad`, and the optimizer skips them); recorded with
`step_trace.py`'s TorchDispatchMode on the CPU. Also bitsandbytes'
quantization maps (`create_dynamic_map`), which its 8-bit optimizers copy
to the device before their first state.

    python3 tests/reference/optim_step.py > tests/reference/optim_step.json

Needs PyTorch and bitsandbytes (CPU builds are enough).
"""
import json
import platform

import bitsandbytes as bnb
import torch
from torch import nn

from step_trace import Live

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.01, foreach=True),
    "momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=True),
    "adam": lambda ps: torch.optim.Adam(ps, foreach=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, foreach=True),
}


def model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    for p in m[0].parameters():
        p.requires_grad_(False)
    return m


def steps(kind):
    """Events of the first and the second `opt.step()`, each alone."""
    m = model()
    opt = OPTIMIZERS[kind](m.parameters())
    x, y = torch.randn(8, 20), torch.randint(0, 4, (8,))
    out = []
    for _ in range(2):
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        mode = Live()
        with mode:
            opt.step()
        out.append(list(mode.ops))
        opt.zero_grad(set_to_none=True)
    return out


if __name__ == "__main__":
    m = model()
    print(json.dumps({
        "torch": torch.__version__,
        "bitsandbytes": bnb.__version__,
        "python": platform.python_version(),
        "device": "cpu",
        "parameters": [{"shape": list(p.shape), "requires_grad": p.requires_grad} for p in m.parameters()],
        "steps": {k: dict(zip(["first", "second"], steps(k))) for k in OPTIMIZERS},
        "dynamic_map": bnb.functional.create_dynamic_map(signed=True).tolist(),
        "udynamic_map": bnb.functional.create_dynamic_map(signed=False).tolist(),
    }))

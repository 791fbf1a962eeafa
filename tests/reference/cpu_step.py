#!/usr/bin/env python3
"""The numbers of one training step in PyTorch, for the CPU interpreter of
vramlab's step programs (`crates/train/src/cpu`) to equal: tiny
transformers (LayerNorm with a tied head, RMSNorm untied with fused
attention, LoRA) and a CNN, with every parameter set by a formula the Rust
test repeats (0.4 sin(0.37 (j + 1) + 1.1 (i + 1)) for element j of
parameter i) and a batch made by another, in float32. For each case: the
loss, and per parameter the sum of its gradient, the sum of its absolute
values and its sum weighted by cos(0.5 j) (none for a frozen parameter).

    python3 tests/reference/cpu_step.py > tests/reference/cpu_step.json

Needs PyTorch (a CPU build is enough).
"""
import json
import platform

import torch
import torch.nn.functional as F

from param_counts import Transformer, cnn, mlp
from step_trace import Attention


class Gpt(Transformer):
    """vramlab's transformer (param_counts' modules, in its order) with a
    forward: step_trace's attention, GELU, the head on the final norm."""

    def __init__(self, heads, fused, **shape):
        super().__init__(heads=heads, **shape)
        for b in self.h:
            b.attn.heads, b.attn.fused = heads, fused

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = x + Attention.forward(b.attn, b.ln_1(x))
            x = x + b.mlp.c_proj(F.gelu(b.mlp.c_fc(b.ln_2(x))))
        return self.lm_head(self.ln_f(x))


def set_values(model):
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            j = torch.arange(p.numel(), dtype=torch.float64)
            p.copy_((0.4 * torch.sin(0.37 * (j + 1) + 1.1 * (i + 1))).to(torch.float32).view_as(p))


def summary(model, loss):
    loss.backward()
    grads = []
    for p in model.parameters():
        if p.grad is None:
            grads.append(None)
            continue
        g = p.grad.flatten().double()
        w = torch.cos(0.5 * torch.arange(g.numel(), dtype=torch.float64))
        grads.append([g.sum().item(), g.abs().sum().item(), (g * w).sum().item()])
    return {"loss": loss.item(), "grads": grads}


def transformer(batch, **shape):
    model = Gpt(**shape)
    set_values(model)
    n = batch * shape["seq_len"]
    ids = [(3 * k + k // 4) % shape["vocab"] for k in range(n)]
    x = torch.tensor(ids).view(batch, shape["seq_len"])
    y = (x + 2) % shape["vocab"]
    logits = model(x)
    return summary(model, F.cross_entropy(logits.flatten(0, 1), y.flatten()))


def cnn_case(batch, **shape):
    model = cnn(**shape)
    set_values(model)
    n = batch * shape["channels"] * shape["image_size"] ** 2
    k = torch.arange(n, dtype=torch.float64)
    x = torch.sin(0.31 * k).to(torch.float32).view(batch, shape["channels"], shape["image_size"], shape["image_size"])
    y = torch.arange(batch) % shape["classes"]
    return summary(model, F.cross_entropy(model(x), y))


def mlp_case(batch, **shape):
    model = mlp(**shape)
    set_values(model)
    k = torch.arange(batch * shape["input_dim"], dtype=torch.float64)
    x = torch.cos(0.23 * k).to(torch.float32).view(batch, shape["input_dim"])
    y = (3 * torch.arange(batch)) % shape["classes"]
    return summary(model, F.cross_entropy(model(x), y))


GPT = dict(layers=2, width=8, heads=2, seq_len=5, vocab=7, mlp_ratio=2)
CASES = [
    ("layernorm, tied, eager", lambda: transformer(2, **GPT, norm="layernorm", tied=True, fused=False)),
    ("rmsnorm, untied, sdpa", lambda: transformer(2, **GPT, norm="rmsnorm", tied=False, fused=True)),
    ("layernorm, tied, eager, lora 2", lambda: transformer(2, lora_rank=2, **GPT, norm="layernorm", tied=True, fused=False)),
    ("cnn", lambda: cnn_case(4, channels=2, image_size=6, blocks=2, width=3, classes=3)),
    ("mlp", lambda: mlp_case(7, layers=3, width=6, input_dim=5, classes=4)),
]

if __name__ == "__main__":
    torch.manual_seed(0)
    out = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cases": {name: run() for name, run in CASES},
    }
    print(json.dumps(out, indent=1))

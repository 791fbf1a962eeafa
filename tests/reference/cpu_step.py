#!/usr/bin/env python3
"""The numbers of one training step in PyTorch, for the CPU interpreter of
vramlab's step programs (`shared/src/train/cpu`) to equal: tiny
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
import math
import platform

import torch
import torch.nn.functional as F
from torch import nn

from param_counts import cnn, with_lora


class Gpt(nn.Module):
    """vramlab's transformer: parameters registered in its order."""

    def __init__(self, layers, width, heads, seq_len, vocab, mlp_ratio, norm, tied, fused):
        super().__init__()
        self.heads, self.fused = heads, fused
        Norm = nn.LayerNorm if norm == "layernorm" else nn.RMSNorm
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.h = nn.ModuleList()
        for _ in range(layers):
            b = nn.Module()
            b.ln_1 = Norm(width)
            b.attn = nn.Module()
            b.attn.c_attn = nn.Linear(width, 3 * width)
            b.attn.c_proj = nn.Linear(width, width)
            b.ln_2 = Norm(width)
            b.mlp = nn.Module()
            b.mlp.c_fc = nn.Linear(width, mlp_ratio * width)
            b.mlp.c_proj = nn.Linear(mlp_ratio * width, width)
            self.h.append(b)
        self.ln_f = Norm(width)
        if not tied:
            self.lm_head = nn.Linear(width, vocab, bias=False)
        self.tied = tied

    def attention(self, a, x):
        b, s, d = x.shape
        q, k, v = a.c_attn(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.heads) ** 0.5)
            mask = torch.ones(s, s, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return a.c_proj(y.transpose(1, 2).contiguous().view(b, s, d))

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = x + self.attention(b.attn, b.ln_1(x))
            x = x + b.mlp.c_proj(F.gelu(b.mlp.c_fc(b.ln_2(x))))
        x = self.ln_f(x)
        head = self.wte.weight if self.tied else self.lm_head.weight
        return x @ head.t()


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


def transformer(batch, lora_rank=0, **shape):
    model = Gpt(**shape)
    if lora_rank:
        with_lora(model, lora_rank)
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


GPT = dict(layers=2, width=8, heads=2, seq_len=5, vocab=7, mlp_ratio=2)
CASES = [
    ("layernorm, tied, eager", lambda: transformer(2, **GPT, norm="layernorm", tied=True, fused=False)),
    ("rmsnorm, untied, sdpa", lambda: transformer(2, **GPT, norm="rmsnorm", tied=False, fused=True)),
    ("layernorm, tied, eager, lora 2", lambda: transformer(2, lora_rank=2, **GPT, norm="layernorm", tied=True, fused=False)),
    ("cnn", lambda: cnn_case(4, channels=2, image_size=6, blocks=2, width=3, classes=3)),
]

if __name__ == "__main__":
    torch.manual_seed(0)
    out = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cases": {name: run() for name, run in CASES},
    }
    print(json.dumps(out, indent=1))

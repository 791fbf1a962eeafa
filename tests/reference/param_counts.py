#!/usr/bin/env python3
"""The parameters and buffers PyTorch's own nn.Modules have for the model
kinds vramlab builds (`model` with "kind": mlp, cnn, transformer), for
several shapes: names, shapes and counts in registration order (the order
`model.cuda()` moves them in). Prints JSON; tests/reference/param_counts.json
is its output, and shared's tests check `train::kinds` against it.

    python3 tests/reference/param_counts.py > tests/reference/param_counts.json

Needs PyTorch (a CPU build is enough).
"""
import json
import platform

import torch
from torch import nn


def mlp(layers, width, input_dim, classes):
    dims = [input_dim] + [width] * layers + [classes]
    mods = []
    for i in range(len(dims) - 1):
        mods.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def cnn(channels, image_size, blocks, width, classes):
    """Conv2d(3x3, padding 1) -> BatchNorm2d -> ReLU -> MaxPool2d(2) blocks,
    the channels doubling from `width`, then Flatten and a Linear head."""
    mods, c_in, c_out, size = [], channels, width, image_size
    for _ in range(blocks):
        mods += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2)]
        c_in, c_out, size = c_out, c_out * 2, size // 2
    mods += [nn.Flatten(), nn.Linear(c_in * size * size, classes)]
    return nn.Sequential(*mods)


class Block(nn.Module):
    def __init__(self, width, heads, mlp_ratio, norm):
        super().__init__()
        self.ln_1 = norm(width)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(width, 3 * width)
        self.attn.c_proj = nn.Linear(width, width)
        self.ln_2 = norm(width)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(width, mlp_ratio * width)
        self.mlp.c_proj = nn.Linear(mlp_ratio * width, width)


class LoraLinear(nn.Module):
    """peft's `lora.Linear` as `get_peft_model` wraps an `nn.Linear`
    (`LoraConfig(r=rank, lora_dropout=0)`: the dropout is `nn.Identity`),
    its modules registered as peft registers them (`base_layer`, then the
    `lora_A` and `lora_B` dicts with the "default" adapter):
    `result = base_layer(x); result = result + lora_B(lora_A(x)) * scaling`."""

    def __init__(self, base, rank):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base.in_features, rank, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(rank, base.out_features, bias=False)})
        nn.init.zeros_(self.lora_B["default"].weight)
        self.scaling = 8 / rank

    def forward(self, x):
        result = self.base_layer(x)
        return result + self.lora_B["default"](self.lora_A["default"](x)) * self.scaling


def with_lora(model, rank):
    """`get_peft_model(model, LoraConfig(r=rank, target_modules="all-linear"))`
    (the names without peft's `base_model.model.` prefix): every linear
    layer of the blocks gets adapters (not the head), and every parameter
    but the adapters is frozen."""
    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.h:
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, LoraLinear(child, rank))
    return model


class Transformer(nn.Module):
    """A decoder-only language model as GPT-2 lays it out."""

    def __init__(self, layers, width, heads, seq_len, vocab, mlp_ratio, norm, tied, lora_rank=0):
        super().__init__()
        norm = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}[norm]
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.h = nn.ModuleList(Block(width, heads, mlp_ratio, norm) for _ in range(layers))
        self.ln_f = norm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight
        if lora_rank:
            with_lora(self, lora_rank)


CASES = [
    ("mlp", dict(layers=2, width=128, input_dim=784, classes=10)),
    ("mlp", dict(layers=8, width=512, input_dim=784, classes=10)),
    ("cnn", dict(channels=3, image_size=32, blocks=3, width=32, classes=10)),
    ("cnn", dict(channels=1, image_size=28, blocks=2, width=16, classes=10)),
    ("cnn", dict(channels=3, image_size=224, blocks=5, width=64, classes=1000)),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, mlp_ratio=4, norm="layernorm", tied=True)),
    ("transformer", dict(layers=12, width=768, heads=12, seq_len=1024, vocab=50257, mlp_ratio=4, norm="layernorm", tied=True)),
    ("transformer", dict(layers=4, width=256, heads=8, seq_len=512, vocab=32000, mlp_ratio=2, norm="rmsnorm", tied=False)),
    ("transformer", dict(layers=2, width=128, heads=4, seq_len=256, vocab=1000, mlp_ratio=4, norm="layernorm", tied=True, lora_rank=8)),
    ("transformer", dict(layers=4, width=256, heads=8, seq_len=512, vocab=32000, mlp_ratio=2, norm="rmsnorm", tied=False, lora_rank=16)),
]
BUILD = {"mlp": mlp, "cnn": cnn, "transformer": Transformer}


def describe(kind, shape):
    model = BUILD[kind](**shape)
    return {
        "kind": kind,
        **shape,
        "parameters": [[n, list(p.shape)] for n, p in model.named_parameters()],
        "buffers": [[n, list(b.shape), str(b.dtype).removeprefix("torch.")] for n, b in model.named_buffers()],
        "count": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


if __name__ == "__main__":
    print(json.dumps({
        "torch": torch.__version__,
        "python": platform.python_version(),
        "models": [describe(k, s) for k, s in CASES],
    }, indent=1))

"""vramlab's reference models: a GPT (nanoGPT's shape: token and position
embeddings, pre-norm blocks of attention and an MLP, the head tied to the
embedding) and a CNN (blocks of Conv2d 3x3, BatchNorm2d, ReLU and
MaxPool2d(2), then a Linear layer). Built on the host, moved to the GPU as
the engine's model; `model(x)` gives the logits (a GPT's for every
token: `cross_entropy(logits.flatten(0, 1), y.flatten())`). Their names
and arguments are the code pane's."""

import torch
from torch import nn
from torch.nn.engine import EngineModel, ModelOutput


def _norm_name(norm):
    name = getattr(norm, "__name__", str(norm))
    return {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}.get(name, "layernorm")


class _Checkpointing:
    """transformers' names: each block under
    `checkpoint(block, x, use_reentrant=False)` while enabled."""

    gradient_checkpointing = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.gradient_checkpointing = True

    def gradient_checkpointing_disable(self):
        self.gradient_checkpointing = False


class GPT(_Checkpointing, nn.Module):
    def __init__(self, layers, width, heads, seq_len, vocab, mlp_ratio=4, norm=nn.LayerNorm, tied=True,
                 attn_implementation="eager"):
        nn.Module.__init__(self)
        self.config = dict(kind="transformer", layers=layers, width=width, heads=heads, seq_len=seq_len,
                           vocab=vocab, mlp_ratio=mlp_ratio, norm=_norm_name(norm), tied=bool(tied))
        # softmax(q @ k.T) @ v written out ("eager"), or
        # F.scaled_dot_product_attention ("sdpa"); it can change between steps.
        self.attn_implementation = attn_implementation
        self.lora_rank = None
        self.wte = nn.Parameter(torch.empty(vocab, width))

    def set_attn_implementation(self, name):
        """transformers' name for switching attention; a PeftModel passes
        it on (setting `model.attn_implementation` on one would not)."""
        if name not in ("eager", "sdpa"):
            raise ValueError('attn_implementation is "eager" or "sdpa", not %r' % (name,))
        self.attn_implementation = name

    def _engine_model(self, dtype):
        cmd = dict(self.config)
        if self.lora_rank:
            cmd["lora_rank"] = self.lora_rank
        t, v = self.config["seq_len"], self.config["vocab"]
        kind = {"kind": "transformer", "x_shape": (t,), "x_dtype": torch.int64, "y_shape": (t,),
                "out_shape": (t, v), "attention": lambda: self.attn_implementation,
                "checkpointing": lambda: self.gradient_checkpointing}
        return EngineModel.place_kind(self, cmd, (self.config["layers"], self.config["width"], t, v), kind, dtype)

    def forward(self, idx):
        raise RuntimeError("GPT runs on the GPU: move it there first (model.cuda())")


class CNN(_Checkpointing, nn.Module):
    def __init__(self, channels=3, image_size=32, blocks=3, width=64, classes=10):
        nn.Module.__init__(self)
        self.config = dict(kind="cnn", channels=channels, image_size=image_size, blocks=blocks, width=width,
                           classes=classes, layers=blocks)
        self.conv1 = nn.Parameter(torch.empty(width, channels, 3, 3))

    def _engine_model(self, dtype):
        c, s, k = self.config["channels"], self.config["image_size"], self.config["classes"]
        kind = {"kind": "cnn", "x_shape": (c, s, s), "x_dtype": torch.float32, "y_shape": (), "out_shape": (k,),
                "checkpointing": lambda: self.gradient_checkpointing}
        return EngineModel.place_kind(self, self.config, (self.config["blocks"], self.config["width"], c * s * s, k),
                                      kind, dtype)

    def forward(self, x):
        raise RuntimeError("CNN runs on the GPU: move it there first (model.cuda())")

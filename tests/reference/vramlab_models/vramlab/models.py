"""vramlab's reference models in plain PyTorch, for running the lessons'
Python with the real framework (tests/reference/lesson_python_gpu.py puts
this folder first on the path): the GPT and the CNN the engine models, op
for op as tests/reference/step_trace.py traces them, with the names and
arguments of the code pane's `from vramlab.models import GPT, CNN`.

- GPT: nanoGPT's shape (token and position embeddings, pre-norm blocks of
  causal attention and a GELU MLP, a final norm, the head tied to the token
  embedding unless `tied=False`). The head is applied with `F.linear`, not
  an `nn.Linear`, so peft's `target_modules="all-linear"` puts adapters on
  the blocks' linear layers only, as the engine's LoRA does.
- CNN: blocks of Conv2d(3x3, padding 1) -> BatchNorm2d -> ReLU ->
  MaxPool2d(2), the channels doubling from `width`, then a Linear layer.
- `set_attn_implementation("eager" | "sdpa")` and
  `gradient_checkpointing_enable()` / `gradient_checkpointing_disable()`
  as transformers names them (each block under
  `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`);
  peft's PeftModel finds both through its attribute lookup.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class _Checkpointing:
    gradient_checkpointing = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.gradient_checkpointing = True

    def gradient_checkpointing_disable(self):
        self.gradient_checkpointing = False

    def _run(self, block, x):
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return checkpoint(block, x, use_reentrant=False)
        return block(x)


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: written out (`eager`) or
    `F.scaled_dot_product_attention` (`fused`); step_trace.py traces it."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def attend(self, x, fused):
        b, s, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        if fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.heads) ** 0.5)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, s, d))


class Attention(CausalSelfAttention):
    """Its GPT's `attn_implementation` picks the kernel."""

    def __init__(self, width, heads, gpt):
        super().__init__(width, heads)
        self._gpt = [gpt]  # not a submodule

    def forward(self, x):
        return self.attend(x, self._gpt[0].attn_implementation == "sdpa")


class Mlp(nn.Module):
    def __init__(self, width, ratio):
        super().__init__()
        self.c_fc = nn.Linear(width, ratio * width)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(ratio * width, width)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, width, heads, mlp_ratio, norm, gpt):
        super().__init__()
        self.ln_1 = norm(width)
        self.attn = Attention(width, heads, gpt)
        self.ln_2 = norm(width)
        self.mlp = Mlp(width, mlp_ratio)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(_Checkpointing, nn.Module):
    def __init__(self, layers, width, heads, seq_len, vocab, mlp_ratio=4, norm=nn.LayerNorm, tied=True,
                 attn_implementation="eager"):
        nn.Module.__init__(self)
        self.attn_implementation = attn_implementation
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.h = nn.ModuleList(Block(width, heads, mlp_ratio, norm, self) for _ in range(layers))
        self.ln_f = norm(width)
        self.lm_head_weight = None if tied else nn.Parameter(torch.empty(vocab, width).normal_(0, 0.02))

    def set_attn_implementation(self, name):
        self.attn_implementation = name

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = self._run(block, x)
        head = self.wte.weight if self.lm_head_weight is None else self.lm_head_weight
        return F.linear(self.ln_f(x), head)


class CNN(_Checkpointing, nn.Module):
    def __init__(self, channels=3, image_size=32, blocks=3, width=64, classes=10):
        super().__init__()
        mods, c_in, c_out, size = [], channels, width, image_size
        for _ in range(blocks):
            mods.append(nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(),
                                      nn.MaxPool2d(2)))
            c_in, c_out, size = c_out, c_out * 2, size // 2
        self.blocks = nn.ModuleList(mods)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c_in * size * size, classes))

    def forward(self, x):
        for block in self.blocks:
            x = self._run(block, x)
        return self.head(x)

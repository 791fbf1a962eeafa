# Start PyTorch on a 16 GiB GPU.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = GPT(layers=24, width=1024, heads=16, seq_len=1024, vocab=50257).cuda() # GPT-2
# medium, 355M parameters
from vramlab.models import GPT
model = GPT(layers=24, width=1024, heads=16, seq_len=1024, vocab=50257, mlp_ratio=4, norm=nn.LayerNorm, tied=True).cuda()

opt = torch.optim.AdamW(model.parameters())

# data = sequences of 1024 tokens
data = TensorDataset(torch.randint(0, 50257, (10000, 1024)), torch.randint(0, 50257, (10000, 1024)))  # token ids and the next ones, on the host

# Fine-tune all of it: two steps at batch 4
total_loss = 0.0
model.set_attn_implementation("sdpa")
for step in range(2):
    inputs, targets = data[:4]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → The weights (1.32 GiB), a gradient for each (1.32 GiB), AdamW's two states (2.64
# GiB), and the activations of 4 x 1024 tokens through 24 blocks and a 50,257-word head.

# Batch 8
try:
    for step in range(1):
        inputs, targets = data[:8]
        x, y = inputs.cuda(), targets.cuda()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        total_loss += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
except torch.cuda.OutOfMemoryError as e:
    print(type(e).__name__, e)
    last_exception = e

# del last_exception # its frame held the failed step's tensors
del last_exception

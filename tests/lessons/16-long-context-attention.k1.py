# Start PyTorch on a 16 GiB GPU.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = GPT(layers=6, width=512, heads=8, seq_len=1024, vocab=8000).cuda()
from vramlab.models import GPT
model = GPT(layers=6, width=512, heads=8, seq_len=1024, vocab=8000, mlp_ratio=4, norm=nn.LayerNorm, tied=True).cuda()

opt = torch.optim.Adam(model.parameters())

# data = sequences of 1024 tokens
data = TensorDataset(torch.randint(0, 8000, (10000, 1024)), torch.randint(0, 8000, (10000, 1024)))  # token ids and the next ones, on the host

# Train two steps at batch 8, attention written out: softmax(q @ k.T) @ v
total_loss = 0.0
for step in range(2):
    inputs, targets = data[:8]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Each layer keeps its softmax output for backward: batch x heads x 1024 x 1024
# floats, 256 MiB a layer.

# Ask for the estimate
# estimate parameters, gradients, optimizer state and activations at batch 8

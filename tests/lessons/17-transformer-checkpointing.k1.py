# Start PyTorch on a 16 GiB GPU.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = GPT(layers=12, width=768, heads=12, seq_len=1024, vocab=8000).cuda()
from vramlab.models import GPT
model = GPT(layers=12, width=768, heads=12, seq_len=1024, vocab=8000, mlp_ratio=4, norm=nn.LayerNorm, tied=True).cuda()

opt = torch.optim.Adam(model.parameters())

# data = sequences of 1024 tokens
data = TensorDataset(torch.randint(0, 8000, (10000, 1024)), torch.randint(0, 8000, (10000, 1024)))  # token ids and the next ones, on the host

# Train two steps at batch 8 (fused attention)
total_loss = 0.0
model.set_attn_implementation("sdpa")
for step in range(2):
    inputs, targets = data[:8]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Every block keeps about sixteen hidden states of batch x 1024 x 768 floats for
# backward: the norms' inputs and outputs, q, k, v, the attention's output and the MLP's
# four-times-wider ones.

# The same, each block under torch.utils.checkpoint
model.gradient_checkpointing_enable()
for step in range(2):
    inputs, targets = data[:8]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Checkpointing keeps only each block's input. Backward runs each block's forward
# again, one block at a time, so one block's saved tensors live at once instead of
# twelve: a third forward pass's compute for most of the memory.

# Spend what it saved: batch 32, checkpointed
for step in range(2):
    inputs, targets = data[:32]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)

# Batch 32 without checkpointing
try:
    model.gradient_checkpointing_disable()
    for step in range(1):
        inputs, targets = data[:32]
        x, y = inputs.cuda(), targets.cuda()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        total_loss += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
except torch.cuda.OutOfMemoryError as e:
    print(type(e).__name__, e)
    last_exception = e

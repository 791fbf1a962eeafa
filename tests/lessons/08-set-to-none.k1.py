# Start PyTorch.
# vramlab python --settings '{"framework":"pytorch"}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = MLP(784, 4 x 1024, 10).cuda()
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), *[m for _ in range(3) for m in (nn.Linear(1024, 1024), nn.ReLU())], nn.Linear(1024, 10)).cuda()

# data = a synthetic MNIST-sized set (60,000 x 784), kept on the host
data = TensorDataset(torch.randn(60000, 784), torch.randint(0, 10, (60000,)))  # on the host

# opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt = torch.optim.SGD(model.parameters())

# train 3 steps with opt.zero_grad(set_to_none=False)
total_loss = 0.0
for step in range(3):
    inputs, targets = data[:64]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=False)
# → Zeroing in place keeps every gradient buffer allocated between steps. (Their
# blocks hold 960 KiB more than the parameters': a gradient given a cached block with 1
# MiB or less to spare takes it whole, because the large pool splits only when more than
# 1 MiB would remain.)

# train 3 steps with opt.zero_grad(set_to_none=True)
for step in range(3):
    inputs, targets = data[:64]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Setting .grad to None frees the gradients between steps: that memory is free for
# activations. The loop's last batch (x and y, 196.50 KiB) stays bound after the loop,
# as loop variables do.

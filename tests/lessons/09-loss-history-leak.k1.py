# Start PyTorch.
# vramlab python --settings '{"framework":"pytorch"}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = MLP(784, 2 x 128, 10).cuda() # small enough that every loss is computed here
model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), *[m for _ in range(1) for m in (nn.Linear(128, 128), nn.ReLU())], nn.Linear(128, 10)).cuda()

# data = a synthetic MNIST-sized set (60,000 x 784), kept on the host
data = TensorDataset(torch.randn(60000, 784), torch.randint(0, 10, (60000,)))  # on the host

# opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt = torch.optim.SGD(model.parameters())

# train 100 steps with total_loss += loss.item()
total_loss = 0.0
for step in range(100):
    inputs, targets = data[:32]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → loss.item() is a Python float: nothing stays on the GPU. What is left: 6
# parameters, the last batch and the last loss.

# train 100 steps with total_loss += loss
for step in range(100):
    inputs, targets = data[:32]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss  # one scalar on the GPU; its history is host memory
    opt.step()
    opt.zero_grad(set_to_none=True)
# → The first `+=` makes `total_loss` a tensor (0 + loss): one scalar more, 512 bytes.
# Every later step adds into it in place.

# 100 more steps
for step in range(100):
    inputs, targets = data[:32]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss  # one scalar on the GPU; its history is host memory
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Nothing more on the GPU. The history `total_loss` carries is autograd's nodes, in
# host memory: each step's `loss.backward()` already let go of every tensor its graph
# saved, and an add saves nothing. PyTorch's own loop keeps exactly this
# (tests/reference/loss_history.py).

# val_a = criterion(model(x), y) # an evaluation batch, without torch.no_grad()
inputs, targets = data[:32]
val_a = torch.nn.functional.cross_entropy(model(inputs.cuda()), targets.cuda())
# → A loss whose backward never runs keeps its whole graph: the activations it saved
# stay with it.

# val_b = criterion(model(x), y) # the next one
inputs, targets = data[:32]
val_b = torch.nn.functional.cross_entropy(model(inputs.cuda()), targets.cuda())
# → Two graphs now. Summing such losses (`val_loss += criterion(...)`) keeps every
# batch's graph alive: that is the leak the advice is about, and it is an evaluation
# loop's, not a training loop's.

del val_a
# → Its graph goes with it.

del val_b
# → Back to the model, the last batch, `loss` and `total_loss`. In an evaluation loop,
# `with torch.no_grad():` saves nothing to begin with.

del total_loss
# → The one scalar goes; `.item()` would never have made it.

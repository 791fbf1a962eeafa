# Restart, and try SGD with momentum.
# vramlab python --settings '{"framework":"pytorch"}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = MLP(784, 4 x 1024, 10).cuda()
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), *[m for _ in range(3) for m in (nn.Linear(1024, 1024), nn.ReLU())], nn.Linear(1024, 10)).cuda()

# data = a synthetic MNIST-sized set (60,000 x 784), kept on the host
data = TensorDataset(torch.randn(60000, 784), torch.randint(0, 10, (60000,)))  # on the host

# opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
opt = torch.optim.SGD(model.parameters(), momentum=0.9)

# one training step
total_loss = 0.0
for step in range(1):
    inputs, targets = data[:64]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Momentum keeps one buffer per parameter: 1x. (Plain SGD keeps none.) The loop's
# last batch (x and y, 196.50 KiB) stays bound after the loop, as loop variables do.

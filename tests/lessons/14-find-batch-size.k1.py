# Start PyTorch on a 2 GiB GPU.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":2147483648}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = MLP(784, 4 x 2048, 10).cuda()
model = nn.Sequential(nn.Linear(784, 2048), nn.ReLU(), *[m for _ in range(3) for m in (nn.Linear(2048, 2048), nn.ReLU())], nn.Linear(2048, 10)).cuda()

opt = torch.optim.Adam(model.parameters())

# data = a synthetic MNIST-sized set (60,000 x 784), kept on the host
data = TensorDataset(torch.randn(60000, 784), torch.randint(0, 10, (60000,)))  # on the host

# find the largest batch whose step stays under 80% of the memory
# try batch sizes 1, 2, 4, ... and keep the largest whose step peak stays under 0.8 of the memory limit
# → Each power of two is tried on a scratch copy; the step's peak is measured, not
# guessed.

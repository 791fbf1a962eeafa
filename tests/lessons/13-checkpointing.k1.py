# Start PyTorch.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = MLP(784, 16 x 1024, 10).cuda()
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), *[m for _ in range(15) for m in (nn.Linear(1024, 1024), nn.ReLU())], nn.Linear(1024, 10)).cuda()

# data = a synthetic MNIST-sized set (60,000 x 784), kept on the host
data = TensorDataset(torch.randn(60000, 784), torch.randint(0, 10, (60000,)))  # on the host

# loss = criterion(model(x), y) # batch 4096
inputs, targets = data[:4096]
loss = torch.nn.functional.cross_entropy(model(inputs.cuda()), targets.cuda())
# → 16 hidden layers: 16 ReLU outputs of 16 MiB each stay for backward.

del loss

# loss = criterion(checkpoint_sequential(model, 4, x, use_reentrant=False), y)
import torch.utils.checkpoint
inputs, targets = data[:4096]
loss = torch.nn.functional.cross_entropy(torch.utils.checkpoint.checkpoint_sequential(model, 4, inputs.cuda(), use_reentrant=False), targets.cuda())
# → The 33 modules run in 4 segments of 8; all but the last are checkpointed and keep
# only their input (the first's is the batch). The last runs plainly: its input and 4
# ReLU outputs stay. 7 outputs instead of 16.

loss.backward()

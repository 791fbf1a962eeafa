# Start PyTorch.
# vramlab python --settings '{"framework":"pytorch"}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = MLP(784, 4 x 1024, 10).cuda()
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), *[m for _ in range(3) for m in (nn.Linear(1024, 1024), nn.ReLU())], nn.Linear(1024, 10)).cuda()

# data = a synthetic MNIST-sized set (60,000 x 784), kept on the host
data = TensorDataset(torch.randn(60000, 784), torch.randint(0, 10, (60000,)))  # on the host

opt = torch.optim.Adam(model.parameters())
# → Creating the optimizer allocates nothing: its state is created lazily.

# loss = criterion(model(x), y)
inputs, targets = data[:64]
loss = torch.nn.functional.cross_entropy(model(inputs.cuda()), targets.cuda())

loss.backward()
# → Backward frees the saved activations as it goes and leaves one gradient per
# parameter. Each matrix product's cuBLAS workspace was freed as it returned: PyTorch
# 2.15 keeps none unless TORCH_CUBLAS_WORKSPACE_CACHE=1.

opt.step()
# → Adam's first step allocates exp_avg and exp_avg_sq for every parameter: twice the
# parameters.

# opt.zero_grad() # set_to_none=True, the default
opt.zero_grad(set_to_none=True)

# (estimate the step before running more)
# estimate parameters, gradients, optimizer state and activations at batch 64

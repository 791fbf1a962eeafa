# Start PyTorch.
# vramlab python --settings '{"framework":"pytorch"}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = MLP(784, 4 x 1024, 10).cuda()
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), *[m for _ in range(3) for m in (nn.Linear(1024, 1024), nn.ReLU())], nn.Linear(1024, 10)).cuda()
# → 3,962,890 float32 parameters, each its own tensor.

# data = a synthetic MNIST-sized set (60,000 x 784), kept on the host
data = TensorDataset(torch.randn(60000, 784), torch.randint(0, 10, (60000,)))  # on the host

# loss = criterion(model(x), y) # batch 64
inputs, targets = data[:64]
loss = torch.nn.functional.cross_entropy(model(inputs.cuda()), targets.cuda())
# → The loss keeps its graph, and the graph keeps every ReLU output (4 x 64 x 1024
# floats), the log-softmax output and the batch.

del loss
# → No backward ran, so the graph dies with the loss: everything it saved goes. (Each
# matrix product's cuBLAS workspace was freed as it returned: PyTorch 2.15 keeps none.)

# loss = criterion(model(x), y) # batch 128
inputs, targets = data[:128]
loss = torch.nn.functional.cross_entropy(model(inputs.cuda()), targets.cuda())
# → Twice the batch, twice the activations: they grow in proportion to the batch size,
# the parameters do not.

# with torch.no_grad(): loss = criterion(model(x), y)
inputs, targets = data[:128]
with torch.no_grad():
    loss = torch.nn.functional.cross_entropy(model(inputs.cuda()), targets.cuda())
# → Rebinding `loss` freed the old graph; under no_grad nothing is saved, so only the
# loss itself remains.

# Start PyTorch on a 1 GiB GPU.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":1073741824}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = MLP(784, 4 x 1024, 10).cuda()
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), *[m for _ in range(3) for m in (nn.Linear(1024, 1024), nn.ReLU())], nn.Linear(1024, 10)).cuda()

# data = 65,536 synthetic MNIST-sized images (65,536 x 784), kept on the host
data = TensorDataset(torch.randn(65536, 784), torch.randint(0, 10, (65536,)))  # on the host

# try: loss = criterion(model(x), y) # batch 65,536
try:
    inputs, targets = data[:65536]
    loss = torch.nn.functional.cross_entropy(model(inputs.cuda()), targets.cuda())
except torch.cuda.OutOfMemoryError as e:
    print(type(e).__name__, e)
    last_exception = e
# → The forward pass runs out of memory part way, before Python has moved the labels:
# the exception's traceback holds the frame, and the frame holds the tensors made so far
# (the 196 MiB batch of images among them).

# del sys.last_value # or leave the except block
del last_exception
# → Without the exception, nothing holds the failed step's tensors: they are freed.

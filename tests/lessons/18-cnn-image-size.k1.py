# Start PyTorch on a 16 GiB GPU.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = CNN(channels=3, image_size=64, blocks=4, width=64, classes=100).cuda()
from vramlab.models import CNN
model = CNN(channels=3, image_size=64, blocks=4, width=64, classes=100).cuda()  # per block: Conv2d(3x3) -> BatchNorm2d -> ReLU -> MaxPool2d(2); then Linear

opt = torch.optim.Adam(model.parameters())

# data = 64 x 64 RGB images
data = TensorDataset(torch.randn(10000, 3, 64, 64), torch.randint(0, 100, (10000,)))  # images and labels, on the host

# Train two steps at batch 128
total_loss = 0.0
for step in range(2):
    inputs, targets = data[:128]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → The first block's maps are 64 channels of 64 x 64 for every image; the
# convolution's and ReLU's outputs, the pooled maps and their int64 indices stay for
# backward.

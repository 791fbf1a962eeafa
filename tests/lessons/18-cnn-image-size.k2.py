# Restart, for images twice as wide.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = CNN(..., image_size=128, ...).cuda()
from vramlab.models import CNN
model = CNN(channels=3, image_size=128, blocks=4, width=64, classes=100).cuda()  # per block: Conv2d(3x3) -> BatchNorm2d -> ReLU -> MaxPool2d(2); then Linear

opt = torch.optim.Adam(model.parameters())

# data = 128 x 128 RGB images
data = TensorDataset(torch.randn(10000, 3, 128, 128), torch.randint(0, 100, (10000,)))  # images and labels, on the host

# The same batch of images twice as wide
total_loss = 0.0
for step in range(2):
    inputs, targets = data[:128]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Twice the side is four times the pixels: every activation is four times larger
# (the head's weight grew too: it reads the last maps).

# A quarter of the batch
for step in range(2):
    inputs, targets = data[:32]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → A quarter of the images at four times the pixels: the activations are back where
# they were. Image size and batch trade one for one.

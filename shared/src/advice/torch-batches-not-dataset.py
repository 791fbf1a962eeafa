# The advice: "don't put the whole dataset on the GPU; move one batch at a time"
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

X, y = torch.randn(60000, 784), torch.randint(0, 10, (60000,))
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()

on_gpu = DataLoader(TensorDataset(X.cuda(), y.cuda()), batch_size=64)
for step, (xb, yb) in zip(range(20), on_gpu):
    loss = criterion(model(xb), yb)
    loss.backward()
    opt.step()
    opt.zero_grad()
del on_gpu

loader = DataLoader(TensorDataset(X, y), batch_size=64)
for step, (xb, yb) in zip(range(20), loader):
    xb, yb = xb.cuda(), yb.cuda()
    loss = criterion(model(xb), yb)
    loss.backward()
    opt.step()
    opt.zero_grad()

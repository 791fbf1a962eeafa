# The advice: "out of memory? accumulate gradients over smaller batches"
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

X, y = torch.randn(60000, 784), torch.randint(0, 10, (60000,))
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()

big = DataLoader(TensorDataset(X, y), batch_size=2048)
for step, (xb, yb) in zip(range(5), big):
    loss = criterion(model(xb.cuda()), yb.cuda())
    loss.backward()
    opt.step()
    opt.zero_grad()

small = DataLoader(TensorDataset(X, y), batch_size=512)
for step, (xb, yb) in zip(range(20), small):
    loss = criterion(model(xb.cuda()), yb.cuda()) / 4
    loss.backward()
    if (step + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()

# The advice: "print torch.cuda.memory_allocated() after a step to see how much a batch size needs"
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

X, y = torch.randn(60000, 784), torch.randint(0, 10, (60000,))
loader = DataLoader(TensorDataset(X, y), batch_size=1024)
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
opt = torch.optim.Adam(model.parameters())
criterion = nn.CrossEntropyLoss()
for step, (xb, yb) in zip(range(3), loader):
    loss = criterion(model(xb.cuda()), yb.cuda())
    loss.backward()
    opt.step()
    opt.zero_grad()
print(torch.cuda.memory_allocated())

import torch
from torch.utils.data import DataLoader, TensorDataset

ds = TensorDataset(torch.randn(1000, 256), torch.randint(0, 10, (1000,)))
loader = DataLoader(ds, batch_size=100)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for xb, yb in loader:
    xb, yb = xb.cuda(), yb.cuda()
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    del xb, yb, loss
print(len(loader), torch.cuda.memory_allocated())

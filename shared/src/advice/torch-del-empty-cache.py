# The advice: "after training, del the model and optimizer, then torch.cuda.empty_cache()"
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

X, y = torch.randn(60000, 784), torch.randint(0, 10, (60000,))
loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
for step, (xb, yb) in zip(range(20), loader):
    xb, yb = xb.cuda(), yb.cuda()
    loss = criterion(model(xb), yb)
    loss.backward()
    opt.step()
    opt.zero_grad()
del model, opt
torch.cuda.empty_cache()

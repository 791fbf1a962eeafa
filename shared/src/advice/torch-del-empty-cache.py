# The advice: "after training, del the model and optimizer, run gc.collect(), then torch.cuda.empty_cache()"
import gc

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 1024)
        self.fc2 = nn.Linear(1024, 1024)
        self.fc3 = nn.Linear(1024, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def train(model, loader, opt, steps):
    criterion = nn.CrossEntropyLoss()
    for step, (xb, yb) in zip(range(steps), loader):
        xb, yb = xb.to(device), yb.to(device)
        loss = criterion(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()


def report(when):
    print(f"{when}: {torch.cuda.memory_allocated() / 1e9:.3f} GB allocated, "
          f"{torch.cuda.memory_reserved() / 1e9:.3f} GB reserved")


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
X, y = torch.randn(60000, 784), torch.randint(0, 10, (60000,))
loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)
model = Net().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
train(model, loader, opt, steps=20)
report("after training")
del model, opt
gc.collect()
report("after del and gc.collect()")
torch.cuda.empty_cache()
report("after empty_cache()")

import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
total = 0
for i in range(5):
    x = torch.randn(32, 256, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    total += loss
print(type(total).__name__, torch.cuda.memory_allocated())

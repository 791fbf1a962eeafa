import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
opt = torch.optim.Adam(model.parameters())
before = torch.cuda.memory_allocated()
x = torch.randn(32, 1024, device="cuda")
y = torch.randint(0, 10, (32,), device="cuda")
torch.nn.functional.cross_entropy(model(x), y).backward()
opt.step()
opt.zero_grad(set_to_none=True)
del x, y
print("optimizer state:", torch.cuda.memory_allocated() - before)

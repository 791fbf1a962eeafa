import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
x = torch.randn(64, 512, device="cuda")
y = torch.randint(0, 10, (64,), device="cuda")
loss = criterion(model(x), y)
print("after forward:", torch.cuda.memory_allocated())
loss.backward()
print("after backward:", torch.cuda.memory_allocated())
opt.step()
opt.zero_grad()
print("after step:", torch.cuda.memory_allocated())

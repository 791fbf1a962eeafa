import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
print(torch.cuda.memory_allocated())
model = model.cuda()
print(torch.cuda.memory_allocated())
print(sum(p.numel() for p in model.parameters()))

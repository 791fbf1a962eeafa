import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
model.eval()
x = torch.randn(256, 1024, device="cuda")
with torch.no_grad():
    out = model(x)
print(out.shape, torch.cuda.memory_allocated())

import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096)).half().cuda()
print(torch.cuda.memory_allocated() // 2**20)

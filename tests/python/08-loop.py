import torch

for i in range(3):
    x = torch.empty(1024, 1024, device="cuda")
    print(i, torch.cuda.memory_allocated() // 2**20)

import torch

kept = []
for i in range(4):
    kept.append(torch.empty(1024, 1024, device="cuda"))
print(len(kept), torch.cuda.memory_allocated() // 2**20)
kept.clear()
print(torch.cuda.memory_allocated())

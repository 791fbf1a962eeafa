import torch
big = torch.empty(1024, 1024, 64, device="cuda")
row = big[0]
del big
print(torch.cuda.memory_allocated() // 2**20)
del row
print(torch.cuda.memory_allocated())

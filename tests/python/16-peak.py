import torch

x = torch.empty(1024, 1024, 16, device="cuda")
del x
print(torch.cuda.max_memory_allocated() // 2**20, torch.cuda.memory_allocated())
torch.cuda.reset_peak_memory_stats()
print(torch.cuda.max_memory_allocated())

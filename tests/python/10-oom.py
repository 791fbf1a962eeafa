import torch

try:
    x = torch.empty(1024, 1024, 1024, 64, device="cuda")
except torch.cuda.OutOfMemoryError:
    print("out of memory")
print(torch.cuda.memory_allocated())

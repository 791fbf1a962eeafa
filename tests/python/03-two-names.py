import torch
x = torch.empty(256, 1024, 1024, device="cuda")
y = x
del x
print(torch.cuda.memory_allocated() // 2**20, "MiB: y still holds it")
del y
print(torch.cuda.memory_allocated())

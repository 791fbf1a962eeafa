import torch

x = torch.randn(4096, 4096)
print(torch.cuda.memory_allocated())
y = x.cuda()
print(torch.cuda.memory_allocated() // 2**20)
z = y.cpu()
del y
print(torch.cuda.memory_allocated())

import torch

a = torch.randn(2048, 1024, device="cuda")
b = torch.randn(1024, 512, device="cuda")
c = a @ b
print(c.shape, torch.cuda.memory_allocated() // 2**20)

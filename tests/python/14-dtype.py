import torch

a = torch.zeros(1000, 1000, dtype=torch.float16, device="cuda")
b = torch.zeros(1000, 1000, dtype=torch.float64, device="cuda")
print(a.element_size(), b.element_size())
print(torch.cuda.memory_allocated())

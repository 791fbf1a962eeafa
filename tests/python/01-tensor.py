import torch
x = torch.zeros(1024, 1024, device="cuda")
print(torch.cuda.memory_allocated())
print(torch.cuda.memory_reserved())

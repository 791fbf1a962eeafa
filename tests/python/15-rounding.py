import torch

t = torch.empty(1, device="cuda")
print(torch.cuda.memory_allocated(), torch.cuda.memory_reserved())

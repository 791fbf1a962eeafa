import torch
x = torch.randn(1024, 1024, device="cuda")
del x
print(torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
torch.cuda.empty_cache()
print(torch.cuda.memory_reserved())

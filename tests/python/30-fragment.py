import torch

blocks = [torch.empty(25 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(4)]
del blocks[1], blocks[2]
print(torch.cuda.memory_allocated() // 2**20, torch.cuda.memory_reserved() // 2**20)
torch.cuda.empty_cache()
print(torch.cuda.memory_reserved() // 2**20)

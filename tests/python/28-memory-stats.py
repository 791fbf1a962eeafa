import torch

x = torch.empty(3, 1024, 1024, device="cuda")
s = torch.cuda.memory_stats()
print(s["allocated_bytes.all.current"], s["segment.all.current"])

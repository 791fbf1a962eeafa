import torch

x = torch.empty(1024, 1024, device="cuda")
summary = torch.cuda.memory_summary()
print(summary.splitlines()[1].strip("| ").strip())
print("Allocated memory" in summary)

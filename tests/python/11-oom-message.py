import torch

try:
    x = torch.empty(20 * 2**30, dtype=torch.uint8, device="cuda")
except RuntimeError as e:
    print(type(e).__name__)
    print(str(e).split(".")[0])

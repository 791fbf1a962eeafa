import torch

x = torch.zeros(256, 1024, 1024, device="cuda")  # 1 GiB
!nvidia-smi --query-gpu=memory.used,memory.total --format=csv
del x  # back to PyTorch's cache, not to the driver
!nvidia-smi --query-gpu=memory.used --format=csv,noheader
torch.cuda.empty_cache()
!nvidia-smi --query-gpu=memory.used --format=csv,noheader
!nvidia-smi

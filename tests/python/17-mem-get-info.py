import torch

free, total = torch.cuda.mem_get_info()
print(total // 2**20, "MiB in all")
print(torch.cuda.get_device_name(0))

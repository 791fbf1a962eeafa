# Start PyTorch on a small 1 GiB GPU (724 MiB free after the context).
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":1073741824,"context_bytes":314572800}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

big = torch.empty(700 * 2**20, dtype=torch.uint8, device="cuda")

del big
# → The 700 MiB segment stays cached.

a = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")
# → Best fit: the cached 700 MiB block is split, the new tensor takes its low end.

b = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

c = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

d = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

e = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

f = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

g = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

del a

del c

del e
# → Three 100 MiB holes, each between live tensors: 300 MiB free in the cache, 24 MiB
# free on the device.

try:
    z = torch.empty(150 * 2**20, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError as e:
    print(type(e).__name__, e)
    last_exception = e
# → 324 MiB are free in total, but no hole holds 150 MiB and the driver has 24 MiB:
# PyTorch releases every entirely free segment (there is none), retries once, and
# raises. The message says 300 MiB are reserved but unallocated: fragmentation.

torch.cuda.empty_cache()
# → empty_cache cannot help: the free pieces lie inside a segment that still holds
# live tensors.

z = torch.empty(90 * 2**20, dtype=torch.uint8, device="cuda")
# → A tensor that fits a hole is served from the cache, no driver call needed.

# Start a fresh PyTorch kernel.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"context_bytes":314572800}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

x = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")

# h = [x]; h.append(h)
h = [x]
h.append(h)  # a reference cycle
# → h holds x, and h holds itself: a reference cycle.

del x
# → del removes the name, not the tensor: h still refers to it, so nothing is freed.

del h
# → No name reaches the list any more, but it refers to itself: its reference count
# stays at 1 and it stays alive, holding x, until the cyclic collector runs:
# gc.collect(), or CPython's own, which runs by itself once enough new objects have been
# made (700 in CPython 3.12), so in a real run it can come at any line.

torch.cuda.empty_cache()
# → empty_cache never frees a live tensor: while the cycle lives, x's block stays
# allocated. (In one run with real PyTorch 2.11 on an H100, CPython's own collector
# freed x during this very line, after empty_cache had looked: allocated 0, reserved
# still 64 MiB; in the next run it did not.)

# gc.collect()
import gc
gc.collect()
# → The cyclic collector finds the list unreachable, clears it, and x's last reference
# goes: its block returns to the cache.

torch.cuda.empty_cache()
# → Only now can the free segment go back to the driver.

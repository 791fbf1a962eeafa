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
# gc.collect(), or CPython's own, at a moment you do not choose.

torch.cuda.empty_cache()
# → empty_cache never frees a live tensor: while the cycle lives, x's block stays
# allocated.

# gc.collect()
import gc
gc.collect()
# → The cyclic collector finds the list unreachable, clears it, and x's last reference
# goes: its block returns to the cache.

torch.cuda.empty_cache()
# → Only now can the free segment go back to the driver.

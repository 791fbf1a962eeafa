# Start a fresh PyTorch kernel on a 16 GiB GPU.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"context_bytes":314572800}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
# → A request of 10 MiB or more gets a segment of its own, rounded up to 2 MiB: 256
# MiB exactly.

y = torch.empty(100, dtype=torch.uint8, device="cuda")
# → 100 bytes round up to 512 and come from a new 2 MiB segment of the small pool.

del x
# → x was the only reference: its block goes back to PyTorch's cache. Allocated falls;
# reserved and nvidia-smi do not.

torch.cuda.empty_cache()
# → empty_cache returns every entirely free segment to the driver: x's 256 MiB. y's
# segment still holds y, so its 2 MiB stay.

del y

torch.cuda.empty_cache()
# → Now nothing is cached, yet nvidia-smi still shows 300 MiB: the CUDA context, which
# only ends with the process.

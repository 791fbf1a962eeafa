# Start PyTorch on a small 1 GiB GPU, this time with
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":1073741824,"context_bytes":314572800,"expandable_segments":true}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

big = torch.empty(700 * 2**20, dtype=torch.uint8, device="cuda")
# → Nothing is cached yet: the large pool's expandable segment maps 35 pages of 20 MiB
# for it (one segment_map).

del big
# → The pages stay mapped: reserved does not move.

a = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")
# → Best fit in the mapped range, split: with expandable segments every block splits
# when 512 bytes or more remain.

b = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

c = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

d = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

e = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

f = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

g = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")

del a

del c

del e
# → The same three 100 MiB holes as in the fragmentation lesson. The allocator does
# not count them as inactive splits (expandable memory is left out of that counter).

z = torch.empty(150 * 2**20, dtype=torch.uint8, device="cuda")
# → No hole holds 150 MiB and mapping 8 more pages at the end fails (24 MiB free), so
# PyTorch releases its cache: with expandable segments that unmaps every whole free
# page, the three holes included, although they lie between live tensors. The retry maps
# 160 MiB at the end of the range: no OOM this time.

del b
# → b's 100 MiB go back to the cache; the pages stay mapped.

torch.cuda.empty_cache()
# → Without expandable segments empty_cache can only return segments with nothing in
# them; here it unmaps b's five whole pages from the middle of the range, and nvidia-smi
# falls by 100 MiB.

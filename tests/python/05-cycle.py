import gc
import torch


class Node:
    def __init__(self):
        self.t = torch.empty(1024, 1024, device="cuda")
        self.me = self


n = Node()
del n
print("after del:", torch.cuda.memory_allocated() // 2**20, "MiB")
gc.collect()
print("after gc.collect():", torch.cuda.memory_allocated() // 2**20, "MiB")

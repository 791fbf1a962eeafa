import sys
import torch


def fails():
    big = torch.empty(1024, 1024, 32, device="cuda")
    raise ValueError("boom")


try:
    fails()
except ValueError:
    print("while handling:", torch.cuda.memory_allocated() // 2**20, "MiB")
print("after:", torch.cuda.memory_allocated())

import torch


def work():
    a = torch.ones(2048, 2048, device="cuda")
    b = a * 2
    return b.sum()


s = work()
print(torch.cuda.memory_allocated())
print(torch.cuda.max_memory_allocated() // 2**20)

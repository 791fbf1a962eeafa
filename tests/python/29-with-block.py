import torch


class Scratch:
    def __enter__(self):
        self.t = torch.empty(1024, 1024, 8, device="cuda")
        return self

    def __exit__(self, *exc):
        del self.t
        return False


with Scratch():
    print("inside:", torch.cuda.memory_allocated() // 2**20)
print("outside:", torch.cuda.memory_allocated())

import torch


def main():
    x = torch.rand(512, 512, device="cuda")
    print(f"{torch.cuda.memory_allocated() / 1e6:.3f} MB")


if __name__ == "__main__":
    main()
    print(torch.cuda.memory_allocated())

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
x = torch.randn(100, 100).to(device)
print(x.device, x.is_cuda, x.shape)
print(torch.cuda.memory_allocated())

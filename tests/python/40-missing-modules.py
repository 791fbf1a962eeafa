import matplotlib.pyplot as plt
import torch
from tqdm import tqdm

x = torch.randn(1024, 1024, device="cuda")
losses = []
for i in tqdm(range(3), desc="steps"):
    losses.append(torch.cuda.memory_allocated())
plt.plot(losses)
plt.savefig("memory.png")
print(len(losses), losses[-1])

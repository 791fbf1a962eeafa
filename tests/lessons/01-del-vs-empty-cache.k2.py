# Restart the kernel.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"context_bytes":314572800}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

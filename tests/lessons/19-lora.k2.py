# Start again, for LoRA.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = get_peft_model(GPT(...).cuda(), LoraConfig(r=16, target_modules="all-linear"))
from vramlab.models import GPT
from peft import LoraConfig, get_peft_model
model = get_peft_model(GPT(layers=24, width=1024, heads=16, seq_len=1024, vocab=50257, mlp_ratio=4, norm=nn.LayerNorm, tied=True), LoraConfig(r=16, target_modules="all-linear")).cuda()  # adapters on every block's linear layers; the rest frozen
# → peft freezes every weight and adds two thin matrices (r = 16) beside each linear
# layer: 6.3M parameters that train, 1.7% of the model. The frozen model is still on the
# GPU, all of it.

opt = torch.optim.AdamW(model.parameters())

# data = sequences of 1024 tokens
data = TensorDataset(torch.randint(0, 50257, (10000, 1024)), torch.randint(0, 50257, (10000, 1024)))  # token ids and the next ones, on the host

# LoRA, two steps at batch 4
total_loss = 0.0
model.set_attn_implementation("sdpa")
for step in range(2):
    inputs, targets = data[:4]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Frozen weights get no gradient and no AdamW state: only the adapters do. That is
# what LoRA saves: about 2.6 GiB here, twice the model's size less the adapters'.

# LoRA at batch 8
try:
    for step in range(1):
        inputs, targets = data[:8]
        x, y = inputs.cuda(), targets.cuda()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        total_loss += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
except torch.cuda.OutOfMemoryError as e:
    print(type(e).__name__, e)
    last_exception = e
# → Backward still has to carry gradients through every frozen layer to reach the
# adapters below it, so every block saves what it saved before: LoRA does not shrink the
# activations, and they grow with the batch as they always did.

# del last_exception # its frame held the failed step's tensors
del last_exception

# Batch 8 as two micro-batches of 4
for step in range(2):
    for micro in range(2):
        inputs, targets = data[:4]
        x, y = inputs.cuda(), targets.cuda()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()) / 2
        loss.backward()
        total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → What shrinks activations is a smaller micro-batch (or checkpointing): the
# adapters' gradients add up over the two.

# Restart, for a context four times longer.
# vramlab python --settings '{"framework":"pytorch","device_total_bytes":17179869184,"expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = GPT(..., seq_len=4096, ...).cuda()
from vramlab.models import GPT
model = GPT(layers=6, width=512, heads=8, seq_len=4096, vocab=8000, mlp_ratio=4, norm=nn.LayerNorm, tied=True).cuda()

opt = torch.optim.Adam(model.parameters())

# data = sequences of 4096 tokens
data = TensorDataset(torch.randint(0, 8000, (10000, 4096)), torch.randint(0, 8000, (10000, 4096)))  # token ids and the next ones, on the host

# The same step with 4x the tokens
try:
    total_loss = 0.0
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
# → Four times the tokens make sixteen times the attention matrix: 4 GiB a layer, six
# layers. It does not fit: the first layer's softmax fails. The traceback keeps what the
# frames' names hold (att: 4 GiB).

# del last_exception # its frame held the failed step's tensors
del last_exception

# Now with F.scaled_dot_product_attention (a fused kernel)
model.set_attn_implementation("sdpa")
for step in range(2):
    inputs, targets = data[:8]
    x, y = inputs.cuda(), targets.cuda()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → The fused kernel never writes the 4096 x 4096 matrix: it keeps q, k, v, its output
# and one number per query row (the log-sum-exp). What is left grows with the length,
# not its square. Which kernel runs depends on the card and the type: on this one
# (compute capability 7.5) in float32 it is the memory-efficient kernel; flash needs 8.0
# and float16 or bfloat16.

# Start PyTorch on an RTX 4090 (24 GiB).
# vramlab python --settings '{"framework":"pytorch","gpu":"rtx-4090","expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model =
# AutoModelForCausalLM.from_config(AutoConfig.from_pretrained("meta-llama/Llama-3.1-8B")).to("cuda")
from transformers import AutoConfig, AutoModelForCausalLM
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained("meta-llama/Llama-3.1-8B")).to("cuda")  # the architecture with random weights: the memory of the real ones
# → 8.03 billion parameters in bfloat16: 14.96 GiB, two thirds of the card, before
# anything trains.

# model = get_peft_model(model, LoraConfig(r=16))
from peft import LoraConfig, get_peft_model
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM"))  # adapters; the rest frozen
# → peft puts two thin float32 matrices beside each attention projection it targets by
# default for Llama (q_proj and v_proj): 26 MiB. The 8 billion weights are frozen, and
# they stay where they are.

opt = torch.optim.AdamW(model.parameters())

# data = sequences of 2,048 tokens
data = TensorDataset(torch.randint(0, 128256, (64, 2048)), torch.randint(0, 128256, (64, 2048)))  # token ids

# Two steps, one sequence each, checkpointing each layer
total_loss = 0.0
model.train()
model.gradient_checkpointing_enable()
for step in range(2):
    inputs, targets = data[:1]
    ids = inputs.cuda()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Only the adapters get gradients and AdamW state. The step adds the checkpoints,
# one layer's recomputed activations, and the logits of 2,048 tokens over 128,256 words
# with their float32 copy and gradient.

# Four sequences
try:
    for step in range(1):
        inputs, targets = data[:4]
        ids = inputs.cuda()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        total_loss += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
except torch.cuda.OutOfMemoryError as e:
    print(type(e).__name__, e)
    last_exception = e
# → The logits grow with the tokens: four sequences ask for a 3.9 GiB float32 copy of
# them, and 15 GiB of frozen weights leave no room.

# del last_exception # its frame held the failed step's tensors
del last_exception

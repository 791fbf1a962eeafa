# Start again, for QLoRA.
# vramlab python --settings '{"framework":"pytorch","gpu":"rtx-4090","expandable_segments":false}'
import torch
from torch import nn
from torch.utils.data import TensorDataset

# model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B",
# quantization_config=BitsAndBytesConfig(load_in_4bit=True, ...), device_map={"": 0})
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16), dtype=torch.bfloat16, device_map={"": 0})
# → Each linear layer of the decoder is loaded in bfloat16 and quantized to 4 bits
# (half a byte a weight, and a scale per block of 64), its copy freed: 5.31 GiB. The
# embeddings and the output layer are not quantized.

# model = prepare_model_for_kbit_training(model)
from peft import prepare_model_for_kbit_training
model = prepare_model_for_kbit_training(model)  # the rest upcast to float32; checkpointing on
# → What QLoRA gives back: peft turns every weight that is not 4-bit into float32 for
# a stable training, the embeddings and the output layer (1.05 billion parameters) among
# them: 2 GiB more. It also turns on gradient checkpointing.

# model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
from peft import LoraConfig, get_peft_model
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))  # adapters; the rest frozen
# → QLoRA's recipe adapts every linear layer: 160 MiB of float32 adapters.

opt = torch.optim.AdamW(model.parameters())

# data = sequences of 2,048 tokens
data = TensorDataset(torch.randint(0, 128256, (64, 2048)), torch.randint(0, 128256, (64, 2048)))  # token ids

# Two steps, one sequence each
total_loss = 0.0
model.train()
for step in range(2):
    inputs, targets = data[:1]
    ids = inputs.cuda()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → Each 4-bit layer makes a bfloat16 copy of its weight for every product and drops
# it; the activations between layers are float32 now, and so are the logits and their
# gradient, as before.

# Three sequences
for step in range(1):
    inputs, targets = data[:3]
    ids = inputs.cuda()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    total_loss += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
# → The room the 4-bit weights freed goes to tokens: three sequences fit where LoRA
# took one.

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
# → QLoRA shrank the weights, not the logits: 4 x 2,048 tokens' float32 logits are 3.9
# GiB, and their copies do not fit.

import torch
from transformers import AutoConfig, AutoModelForCausalLM

config = AutoConfig.from_pretrained("Qwen/Qwen3-0.6B")
model = AutoModelForCausalLM.from_config(config).to("cuda")  # random weights: the same memory
print("weights:", torch.cuda.memory_allocated())

ids = torch.randint(0, config.vocab_size, (4, 128), device="cuda")
with torch.no_grad():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False)
print("sequences:", tuple(out.shape))
print("after generate:", torch.cuda.memory_allocated())
print("peak in generate:", torch.cuda.max_memory_allocated())
del out, ids
print("after del:", torch.cuda.memory_allocated())

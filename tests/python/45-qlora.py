# QLoRA: 4-bit weights, readied for training, LoRA on every linear layer; two steps.
import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                         bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", quantization_config=bnb,
                                             dtype=torch.bfloat16, device_map={"": 0})
print("4-bit weights:", torch.cuda.memory_allocated())
model = prepare_model_for_kbit_training(model)
print("prepared:", torch.cuda.memory_allocated())
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
model.print_trainable_parameters()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
ids = torch.randint(0, model.config.vocab_size, (2, 256), device="cuda")
model.train()


def step():
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


step()
before = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
step()
print("second step's peak over what lived before it:", torch.cuda.max_memory_allocated() - before)

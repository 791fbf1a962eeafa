#!/usr/bin/env python3
"""What one QLoRA training step allocates and frees, op by op, on the CPU:
small models of the Llama, Mistral, Qwen, Phi-3 and Gemma families saved in
bfloat16, loaded by `from_pretrained` with bitsandbytes' 4-bit
quantization (nf4, double quantization on and off, bfloat16 compute),
readied by peft's `prepare_model_for_kbit_training` (its default
gradient checkpointing, which PyTorch runs reentrant), LoRA r=4 on every
linear layer, and in training mode also under `torch.autocast` in bfloat16
with CUDA's policy installed (`cuda_autocast.py`), as `Trainer(bf16=True)`
runs it; then, as `hf_train.py` traces a step, the second step's
storages (`step_trace.Live`). Each model both in training mode
(`model.train()`: the layers checkpoint) and as `from_pretrained` leaves
it, in eval mode (transformers' layers skip their checkpoint there, and
the forward makes its `DynamicCache`).

On the CPU bitsandbytes' `gemm_4bit` is one op; CUDA's
`_dequant_linear_fallback` makes its temporaries inside it (docs/simulator.md).

    python3 tests/reference/hf_qlora.py > tests/reference/hf_qlora.json

Needs PyTorch, transformers, peft and bitsandbytes (CPU builds; versions written in the output).
"""
import json
import sys
import tempfile

import bitsandbytes
import peft
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

from hf_generate import CONFIGS
from hf_train import BATCH, SEQ, two_steps

MODELS = ("llama", "mistral", "qwen3", "phi3", "gemma3")
CASES = [dict(model=m, double_quant=dq, train=train)
         for m in MODELS for dq in (True, False) for train in (True, False)]
# `Trainer(bf16=True)`'s autocast around the forward, CUDA's policy installed.
CASES += [dict(model=m, double_quant=True, train=True, amp="bfloat16") for m in MODELS]


def saved(model, folder):
    torch.manual_seed(0)
    config = AutoConfig.for_model(**CONFIGS[model], bos_token_id=None, eos_token_id=None,
                                  pad_token_id=None)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    return config.vocab_size


def run(case):
    with tempfile.TemporaryDirectory() as folder:
        vocab = saved(case["model"], folder)
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=case["double_quant"],
                               bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=q, dtype=torch.bfloat16,
                                                     attn_implementation="sdpa")
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                       target_modules="all-linear", task_type="CAUSAL_LM"))
    if case["train"]:
        model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (BATCH, SEQ))
    return {**case, **two_steps(model, opt, ids, amp=case.get("amp"))}


def main():
    rows = []
    for case in CASES:
        rows.append(run(case))
        print(case, rows[-1]["peak"], file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__,
                      "configs": {m: CONFIGS[m] for m in MODELS}, "cases": rows}))


if __name__ == "__main__":
    main()

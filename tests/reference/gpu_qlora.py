#!/usr/bin/env python3
"""QLoRA's memory on a CUDA GPU, as people run it: a Llama-3.2-1B-shaped model
(its config.json numbers, random bfloat16 weights saved to a temporary folder)
loaded by `from_pretrained` with bitsandbytes' 4-bit quantization, then
peft's `prepare_model_for_kbit_training` and LoRA on every linear layer, and
two AdamW training steps. Prints JSON: for each quantization (nf4 and fp4,
double quantization on and off) the bytes allocated after loading, after
the k-bit preparation and after LoRA, and each step's peak over what lived
before it (`max_memory_allocated`); the 4-bit weights' own tensors (storage,
absmax, and double quantization's second-level tensors) by name and size.

    python3 tests/reference/gpu_qlora.py > tests/golden/qlora.json

Needs a GPU, PyTorch, transformers, peft and bitsandbytes.
"""
import gc
import json
import sys
import tempfile

import torch

SHAPE = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
             num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
             max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
             tie_word_embeddings=True)


def mib(n):
    return round(n / 2**20, 3)


def saved_model(folder):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    del model
    gc.collect()


def one(folder, quant_type, double, batch, seq):
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                           bnb_4bit_use_double_quant=double,
                           bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=q,
                                                 dtype=torch.bfloat16, device_map={"": 0},
                                                 attn_implementation="sdpa")
    row = {"quant_type": quant_type, "double_quant": double, "batch": batch, "seq": seq}
    row["loaded"] = torch.cuda.memory_allocated() - base
    row["load_peak"] = torch.cuda.max_memory_allocated() - base
    tensors = {}
    for name, m in model.named_modules():
        if isinstance(m, bnb.nn.Linear4bit) and name.endswith("layers.0.self_attn.q_proj"):
            w = m.weight
            qs = w.quant_state
            tensors = {"weight": [list(w.shape), str(w.dtype), w.numel() * w.element_size()],
                       "absmax": [list(qs.absmax.shape), str(qs.absmax.dtype)],
                       "blocksize": qs.blocksize, "shape": list(qs.shape)}
            if qs.state2 is not None:
                tensors["state2_absmax"] = [list(qs.state2.absmax.shape), str(qs.state2.absmax.dtype)]
                tensors["offset"] = [list(qs.offset.shape), str(qs.offset.dtype)]
    row["q_proj_0"] = tensors
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    row["prepared"] = torch.cuda.memory_allocated() - base
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                             lora_dropout=0.0, task_type="CAUSAL_LM"))
    row["lora"] = torch.cuda.memory_allocated() - base
    row["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, SHAPE["vocab_size"], (batch, seq), device="cuda")
    steps = []
    for _ in range(2):
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        steps.append({"peak_over_before": torch.cuda.max_memory_allocated() - before,
                      "after": torch.cuda.memory_allocated() - base})
    row["steps"] = steps
    row["reserved"] = torch.cuda.memory_reserved()
    del model, opt, ids
    gc.collect()
    torch.cuda.empty_cache()
    print(quant_type, double, {k: (mib(v) if isinstance(v, int) else v) for k, v in row.items()
                               if k in ("loaded", "prepared", "lora")}, file=sys.stderr)
    return row


def main():
    import bitsandbytes
    import peft
    import transformers
    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__,
           "gpu": torch.cuda.get_device_name(), "shape": SHAPE, "runs": []}
    with tempfile.TemporaryDirectory() as folder:
        saved_model(folder)
        for quant_type, double in [("nf4", True), ("nf4", False), ("fp4", False)]:
            try:
                out["runs"].append(one(folder, quant_type, double, 2, 512))
            except Exception as e:  # noqa: BLE001 - recorded, the next run goes on
                out["runs"].append({"quant_type": quant_type, "double_quant": double,
                                    "error": f"{type(e).__name__}: {e}"[:500]})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

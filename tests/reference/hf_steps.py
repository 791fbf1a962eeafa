#!/usr/bin/env python3
"""Training steps and generation of Hugging Face transformers models, built
from their config.json numbers (no weights), on a CUDA GPU: the bytes of the
parameters, of the optimizer's state, each step's peak over what lived
before it, generation's peak with its KV cache, as the caching allocator
counts them (cuda_events.py). Prints JSON.

    python3 tests/reference/hf_steps.py > tests/golden/hf_steps.json
    python3 tests/reference/hf_steps.py --device cpu --tiny   # the script's own check
    python3 tests/reference/hf_steps.py --families > tests/golden/hf_steps-families.json

--families runs the other architectures (Qwen3, Gemma 2 and 3, Phi-3,
Mistral) with the configs the planner ships (crates/hf/src/known.json).

The configs copy the published config.json of each model (links below).
"""
import argparse
import contextlib
import json
import os
import sys

import torch

import cuda_events

# https://huggingface.co/openai-community/gpt2/blob/main/config.json
GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12,
        "n_head": 12, "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
# https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
LLAMA_1B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
            "bos_token_id": 128000, "eos_token_id": 128001}
# https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
QWEN_05B = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
            "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "hidden_act": "silu", "tie_word_embeddings": True, "use_sliding_window": False,
            "sliding_window": 32768, "max_window_layers": 21, "bos_token_id": 151643, "eos_token_id": 151643}
CONFIGS = {"gpt2": GPT2, "llama-3.2-1b": LLAMA_1B, "qwen2.5-0.5b": QWEN_05B}

TRAIN = [
    dict(model="gpt2", dtype="float32", attn="eager", batch=4, seq=512),
    dict(model="gpt2", dtype="float32", attn="sdpa", batch=4, seq=512),
    dict(model="gpt2", dtype="float32", attn="sdpa", batch=4, seq=512, amp="bfloat16"),
    dict(model="gpt2", dtype="float32", attn="sdpa", batch=4, seq=512, checkpointing=True),
    dict(model="qwen2.5-0.5b", dtype="float32", attn="sdpa", batch=2, seq=512, amp="bfloat16"),
    dict(model="llama-3.2-1b", dtype="bfloat16", attn="sdpa", batch=1, seq=1024),
    dict(model="llama-3.2-1b", dtype="bfloat16", attn="eager", batch=1, seq=1024),
    dict(model="llama-3.2-1b", dtype="bfloat16", attn="sdpa", batch=2, seq=1024, checkpointing=True),
    dict(model="llama-3.2-1b", dtype="bfloat16", attn="sdpa", batch=2, seq=1024, lora=16),
]
GENERATE = [
    dict(model="llama-3.2-1b", dtype="bfloat16", attn="sdpa", batch=4, prompt=128, new_tokens=64),
    dict(model="gpt2", dtype="float32", attn="sdpa", batch=8, prompt=256, new_tokens=64),
]
# The planner's shapes, each copied from its published config.json.
KNOWN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "src", "train", "hf",
                     "known.json")
TRAIN_FAMILIES = [
    dict(model="Qwen3-0.6B", dtype="bfloat16", attn="sdpa", batch=2, seq=1024),
    dict(model="Qwen3-0.6B", dtype="bfloat16", attn="eager", batch=2, seq=1024),
    dict(model="Qwen3-0.6B", dtype="bfloat16", attn="sdpa", batch=2, seq=1024, checkpointing=True),
    dict(model="Qwen3-0.6B", dtype="bfloat16", attn="sdpa", batch=2, seq=1024, lora=16),
    dict(model="gemma-3-1b", dtype="bfloat16", attn="sdpa", batch=1, seq=1024),
    dict(model="gemma-3-1b", dtype="bfloat16", attn="eager", batch=1, seq=1024),
    dict(model="gemma-2-2b", dtype="bfloat16", attn="eager", batch=1, seq=1024, lora=16),
    dict(model="Phi-3-mini-4k", dtype="bfloat16", attn="sdpa", batch=1, seq=512),
    dict(model="Phi-3-mini-4k", dtype="bfloat16", attn="sdpa", batch=2, seq=1024, lora=16),
    dict(model="Mistral-7B-v0.3", dtype="bfloat16", attn="sdpa", batch=1, seq=1024, lora=16),
    dict(model="Mistral-7B-v0.3", dtype="bfloat16", attn="sdpa", batch=2, seq=1024, lora=16, checkpointing=True),
]
GENERATE_FAMILIES = [
    dict(model="Qwen3-0.6B", dtype="bfloat16", attn="sdpa", batch=4, prompt=128, new_tokens=64),
    dict(model="Qwen3-0.6B", dtype="bfloat16", attn="sdpa", batch=4, prompt=128, new_tokens=64, cache="static"),
    dict(model="gemma-3-1b", dtype="bfloat16", attn="sdpa", batch=2, prompt=1024, new_tokens=64),
    dict(model="gemma-2-2b", dtype="bfloat16", attn="eager", batch=2, prompt=1024, new_tokens=64),
    dict(model="Phi-3-mini-4k", dtype="bfloat16", attn="sdpa", batch=4, prompt=512, new_tokens=64),
    dict(model="Mistral-7B-v0.3", dtype="bfloat16", attn="sdpa", batch=8, prompt=512, new_tokens=128),
    dict(model="Llama-3.1-8B", dtype="bfloat16", attn="sdpa", batch=16, prompt=1024, new_tokens=128),
    dict(model="Llama-3.1-8B", dtype="bfloat16", attn="sdpa", batch=4, prompt=1024, new_tokens=64, cache="static"),
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tiny(config):
    """The same model type a few layers and dimensions small (the CPU check)."""
    c = dict(config)
    for k, v in {"n_embd": 64, "n_layer": 2, "n_head": 4, "hidden_size": 64, "intermediate_size": 128,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                 "vocab_size": 1000}.items():
        if k in c:
            c[k] = v
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        c.pop(k, None)
    return c


def build(case, args):
    from transformers import AutoConfig, AutoModelForCausalLM

    if case["model"] in CONFIGS:
        raw = CONFIGS[case["model"]]
    else:
        with open(KNOWN) as f:
            raw = {k: v for k, v in next(m for m in json.load(f) if m["name"] == case["model"])["config"].items()
                   if k != "torch_dtype"}
    raw = tiny(raw) if args.tiny else raw
    config = AutoConfig.for_model(**raw)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[case["dtype"]],
                                                 attn_implementation=case["attn"])
    if case.get("lora"):
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=case["lora"], lora_alpha=2 * case["lora"], lora_dropout=0.0,
                                                 target_modules=lora_targets(raw)))
    return model, raw["vocab_size"]


def lora_targets(raw):
    """peft's own default for the model type: Phi-3 projects q, k and v in one."""
    return ["qkv_proj"] if raw["model_type"] == "phi3" else ["q_proj", "v_proj"]


def tensor_bytes(tensors):
    return sum(t.untyped_storage().nbytes() for t in tensors)


def measure(fn, args):
    if args.device == "cpu":
        return {"peak_over_before": None, "allocated_before": None, "allocated_after": None,
                "reserved_after": None, "events": []}, fn()
    return cuda_events.measure(fn)


def train(case, args):
    torch.manual_seed(0)
    model, vocab = build(case, args)
    if case.get("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-5)
    ids = torch.randint(0, vocab, (case["batch"], case["seq"]), device=args.device)
    amp = DTYPES.get(case.get("amp"))

    def step():
        with torch.autocast(args.device, dtype=amp) if amp else contextlib.nullcontext():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    first, loss = measure(step, args)
    second, loss = measure(step, args)
    return {
        **case,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "parameter_bytes": tensor_bytes(model.parameters()),
        "buffer_bytes": tensor_bytes(model.buffers()),
        "optimizer_state_bytes": tensor_bytes(t for s in opt.state.values() for t in s.values()
                                              if isinstance(t, torch.Tensor)),
        "first_step_peak_bytes": first["peak_over_before"],
        "first_step_allocated_before": first["allocated_before"],
        "peak_bytes": second["peak_over_before"],
        "allocated_before": second["allocated_before"],
        "allocated_after": second["allocated_after"],
        "reserved_after": second["reserved_after"],
        "loss": loss.item(),
        "events": second["events"],
    }


def generate(case, args):
    torch.manual_seed(0)
    model, vocab = build(case, args)
    model.eval()
    ids = torch.randint(0, vocab, (case["batch"], case["prompt"]), device=args.device)
    with torch.no_grad():
        row, out = measure(lambda: model.generate(ids, attention_mask=torch.ones_like(ids),
                                                  max_new_tokens=case["new_tokens"],
                                                  min_new_tokens=case["new_tokens"], do_sample=False,
                                                  pad_token_id=0, **cache_kwargs(case)), args)
    return {**case, "parameter_bytes": tensor_bytes(model.parameters()), "output_shape": list(out.shape),
            "peak_bytes": row["peak_over_before"], "allocated_before": row["allocated_before"],
            "allocated_after": row["allocated_after"], "reserved_after": row["reserved_after"],
            "events": row["events"]}


def cache_kwargs(case):
    return {"cache_implementation": case["cache"]} if case.get("cache") else {}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--families", action="store_true")
    p.add_argument("--only", help="these models (names, comma-separated)")
    p.add_argument("--frames", type=int, default=1, help="Python frames kept with each event")
    p.add_argument("--kind", choices=("train", "generate"), help="only training, or only generation")
    args = p.parse_args()
    import transformers
    if args.device == "cuda":
        cuda_events.start(frames=args.frames)
    rows = {"train": [], "generate": []}
    lists = (TRAIN_FAMILIES, GENERATE_FAMILIES) if args.families else (TRAIN, GENERATE)
    for kind, cases, fn in (("train", lists[0], train), ("generate", lists[1], generate)):
        for case in cases:
            if (args.only and case["model"] not in args.only.split(",")) or (args.kind and args.kind != kind):
                continue
            try:
                row = fn(case, args)
            except Exception as e:  # noqa: BLE001 - a failing case is written, the others go on
                row = {**case, "error": f"{type(e).__name__}: {e}"}
            print(kind, case, row.get("peak_bytes"), row.get("error", ""), file=sys.stderr)
            rows[kind].append(row)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import peft
        versions["peft"] = peft.__version__
    except ImportError:
        pass
    if args.device == "cuda":
        versions["cuda"] = torch.version.cuda
        versions["gpu"] = torch.cuda.get_device_name()
    print(json.dumps({"versions": versions, "tiny": args.tiny, **rows}))


if __name__ == "__main__":
    main()

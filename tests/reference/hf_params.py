#!/usr/bin/env python3
"""The parameters and buffers transformers builds for the model shapes people
fine-tune and serve, from their config.json numbers (no weights: the meta
device): each tensor's name, shape and dtype in registration order (the order
`model.cuda()` moves them in), the tied weights counted once, and the totals.
Prints JSON; tests/reference/hf_params.json is its output, the reference for
`"kind": "hf"` models.

    python3 tests/reference/hf_params.py > tests/reference/hf_params.json

Needs PyTorch (a CPU build is enough) and transformers (5.24 made the file).
Each config copies the numbers of the config.json at its link (the fields
that decide the tensors; `torch_dtype` as the file gives it).
"""
import json
import platform

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}

CONFIGS = [
    ("gpt2", "https://huggingface.co/openai-community/gpt2/blob/main/config.json",
     dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, n_positions=1024, n_ctx=1024,
          vocab_size=50257, tie_word_embeddings=True, torch_dtype="float32")),
    ("gpt2-medium", "https://huggingface.co/openai-community/gpt2-medium/blob/main/config.json",
     dict(model_type="gpt2", n_embd=1024, n_layer=24, n_head=16, n_positions=1024, n_ctx=1024,
          vocab_size=50257, tie_word_embeddings=True, torch_dtype="float32")),
    ("Llama-3.2-1B", "https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json",
     dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
          num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
          max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
          rope_scaling=LLAMA3_ROPE | {"factor": 32.0}, tie_word_embeddings=True,
          torch_dtype="bfloat16")),
    ("Llama-3.2-3B", "https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json",
     dict(model_type="llama", hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
          num_attention_heads=24, num_key_value_heads=8, head_dim=128, vocab_size=128256,
          max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
          rope_scaling=LLAMA3_ROPE | {"factor": 32.0}, tie_word_embeddings=True,
          torch_dtype="bfloat16")),
    ("Llama-3.1-8B", "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
     dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
          num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
          max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
          rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False, torch_dtype="bfloat16")),
    ("Mistral-7B-v0.3", "https://huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json",
     dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
          num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
          max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0,
          sliding_window=None, tie_word_embeddings=False, torch_dtype="bfloat16")),
    ("Qwen2.5-0.5B", "https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json",
     dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
          num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
          max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
          tie_word_embeddings=True, torch_dtype="bfloat16")),
    ("Qwen2.5-7B", "https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json",
     dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
          num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
          max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0,
          tie_word_embeddings=False, torch_dtype="bfloat16")),
    ("Qwen3-0.6B", "https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json",
     dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
          num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
          max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
          tie_word_embeddings=True, torch_dtype="bfloat16")),
    ("gemma-2-2b", "https://huggingface.co/google/gemma-2-2b/blob/main/config.json",
     dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
          num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=256000,
          max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
          query_pre_attn_scalar=256, sliding_window=4096, final_logit_softcapping=30.0,
          attn_logit_softcapping=50.0, tie_word_embeddings=True, torch_dtype="float32")),
    ("gemma-3-1b", "https://huggingface.co/google/gemma-3-1b-pt/blob/main/config.json",
     dict(model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
          num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
          max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
          rope_local_base_freq=10000.0, query_pre_attn_scalar=256, sliding_window=512,
          sliding_window_pattern=6, tie_word_embeddings=True, torch_dtype="bfloat16")),
    ("Phi-3-mini-4k", "https://huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/config.json",
     dict(model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
          num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
          max_position_embeddings=4096, original_max_position_embeddings=4096,
          rms_norm_eps=1e-5, rope_theta=10000.0, pad_token_id=32000, bos_token_id=1,
          eos_token_id=32000, tie_word_embeddings=False, torch_dtype="bfloat16")),
]


def describe(name, link, fields):
    fields = dict(fields)
    model_type = fields.pop("model_type")
    dtype = getattr(torch, fields["torch_dtype"])
    config = AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    params = [[n, list(p.shape), str(p.dtype).removeprefix("torch.")]
              for n, p in model.named_parameters()]
    buffers = [[n, list(b.shape), str(b.dtype).removeprefix("torch.")]
               for n, b in model.named_buffers()]
    count = sum(p.numel() for p in model.parameters())
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    return {"name": name, "config": link, "model_type": model_type,
            "fields": {"model_type": model_type, **fields},
            "parameters": params, "buffers": buffers, "count": count,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "buffer_bytes": buffer_bytes,
            "tied": bool(getattr(config, "tie_word_embeddings", False))}


def main():
    torch.manual_seed(0)
    models = [describe(*c) for c in CONFIGS]
    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(), "models": models}
    # One tensor a line: a diff shows which tensor changed.
    lines = ["{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in out.items()
                             if k != "models") + ', "models": [']
    for i, m in enumerate(models):
        head = {k: v for k, v in m.items() if k not in ("parameters", "buffers")}
        lines.append(" " + json.dumps(head)[:-1] + ",")
        for key in ("parameters", "buffers"):
            tensors = [f"  {json.dumps(t)}" for t in m[key]]
            lines.append(f'  "{key}": [')
            lines.append(",\n".join(tensors))
            lines.append("  ]" + ("," if key == "parameters" else ""))
        lines.append(" }" + ("," if i + 1 < len(models) else ""))
    lines.append("]}")
    print("\n".join(line for line in lines if line))


if __name__ == "__main__":
    main()

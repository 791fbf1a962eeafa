#!/usr/bin/env python3
"""What Hugging Face transformers' own `generate()` allocates and frees,
op by op, on the CPU: the tensors each aten op makes (bytes rounded up to
the caching allocator's 512-byte blocks) and when each storage dies
(`step_trace.Live`), with the live bytes before, at the peak of and after
every forward call (the prefill, then one per new token). Greedy search,
`use_cache=True`, under `torch.no_grad()`, the `DynamicCache` or the
`StaticCache` (`cache_implementation="static"`, `disable_compile=True`:
on a GPU transformers would otherwise compile the forward with that cache).

    python3 tests/reference/hf_generate.py > tests/reference/hf_generate.json
    python3 tests/reference/hf_generate.py --real > tests/reference/hf_generate_real.json

--real runs published shapes at full size (the planner's
crates/hf/src/known.json) as the H100 ran them
(tests/golden/hf_steps-families.json), keeping each forward's live bytes
before, at the peak and after, not every event.

Needs PyTorch and transformers (CPU builds; versions written in the output).
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from step_trace import Live

# Small models of each family's shape (their config.json fields, fewer and
# narrower layers), and one of Llama-3.2-1B's layer width.
GPT2 = {"model_type": "gpt2", "vocab_size": 1000, "n_positions": 1024, "n_embd": 64, "n_layer": 2, "n_head": 4,
        "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "tie_word_embeddings": True}
LLAMA = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
         "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "tie_word_embeddings": True}
MISTRAL = {"model_type": "mistral", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 160,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
           "max_position_embeddings": 32768, "rope_theta": 1000000.0, "sliding_window": None,
           "tie_word_embeddings": False}
QWEN2 = {"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": True,
         "use_sliding_window": False}
QWEN3 = {"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "max_position_embeddings": 40960, "rope_theta": 1000000.0, "tie_word_embeddings": True}
GEMMA2 = {"model_type": "gemma2", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "max_position_embeddings": 8192, "query_pre_attn_scalar": 16, "sliding_window": 4096,
          "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "tie_word_embeddings": True}
GEMMA3 = {"model_type": "gemma3_text", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
          "max_position_embeddings": 32768, "query_pre_attn_scalar": 16, "sliding_window": 512,
          "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0, "tie_word_embeddings": True}
PHI3 = {"model_type": "phi3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
        "tie_word_embeddings": False}
WIDE = {**LLAMA, "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 2,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64}
# Gemma's sliding window shorter than the prompt: the sliding layers' cache
# keeps the window's last positions.
WIDE_GEMMA2 = {**GEMMA2, "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 8,
               "num_key_value_heads": 4, "head_dim": 128, "query_pre_attn_scalar": 128, "sliding_window": 64}
WIDE_GEMMA3 = {**GEMMA3, "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 6,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128, "query_pre_attn_scalar": 128,
               "sliding_window": 64}
SMALL_MODELS = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
CONFIGS = {"gpt2": GPT2, "llama": LLAMA, "mistral": MISTRAL, "qwen2": QWEN2, "qwen3": QWEN3, "gemma2": GEMMA2,
           "gemma3": GEMMA3, "phi3": PHI3, "wide": WIDE,
           "wide-gemma2": WIDE_GEMMA2, "wide-gemma3": WIDE_GEMMA3}

SMALL = dict(batch=2, prompt=8, new_tokens=4)
CASES = [dict(model=m, dtype=d, attn=a, cache=c, **SMALL)
         for m in ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
         for d in ("float32", "bfloat16") for a in ("eager", "sdpa") for c in ("dynamic", "static")]
CASES += [dict(model="wide", dtype="bfloat16", attn=a, cache=c, batch=4, prompt=128, new_tokens=16)
          for a in ("sdpa", "eager") for c in ("dynamic", "static")]
CASES += [dict(model=m, dtype="bfloat16", attn=a, cache="dynamic", batch=4, prompt=128, new_tokens=16)
          for m, a in (("wide-gemma2", "eager"), ("wide-gemma3", "sdpa"))]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
KNOWN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "src", "train", "hf",
                     "known.json")
REAL = [dict(model="Qwen3-0.6B", dtype="bfloat16", attn="sdpa", cache="dynamic", batch=4, prompt=128, new_tokens=64),
        dict(model="gemma-3-1b", dtype="bfloat16", attn="sdpa", cache="dynamic", batch=2, prompt=1024, new_tokens=64)]


def real_configs():
    """The published shapes, without the token ids a 1,000-token check needs gone."""
    with open(KNOWN) as f:
        return {m["name"]: {k: v for k, v in m["config"].items()
                            if k not in ("torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id")}
                for m in json.load(f)}


def run(case):
    torch.manual_seed(0)
    config = AutoConfig.for_model(**CONFIGS[case["model"]], bos_token_id=None, eos_token_id=None,
                                  pad_token_id=None)
    model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[case["dtype"]],
                                             attn_implementation=case["attn"]).eval()
    ids = torch.randint(0, config.vocab_size, (case["batch"], case["prompt"]))
    mask = torch.ones_like(ids)
    live = Live()
    calls = []

    def before(_module, _args, _kwargs):
        calls.append({"event": len(live.ops), "before": live.live})
        live.peak = live.live

    def after(_module, _args, _kwargs, _out):
        calls[-1].update(peak=live.peak, after=live.live, end_event=len(live.ops))

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)
    extra = {"cache_implementation": "static", "disable_compile": True} if case["cache"] == "static" else {}
    with torch.no_grad(), live:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=case["new_tokens"], do_sample=False,
                             **extra)
        shape = list(out.shape)
        del out
    # The wide and real models' events are many: their forwards' peaks are what is compared.
    events = live.ops if case["model"] in SMALL_MODELS else []
    return {**case, "output_shape": shape, "peak": live.peak, "calls": calls, "events": events}


def main():
    cases = CASES
    if sys.argv[1:] == ["--real"]:
        known = real_configs()
        CONFIGS.clear()
        CONFIGS.update({c["model"]: known[c["model"]] for c in REAL})
        cases = REAL
    rows = []
    for case in cases:
        try:
            rows.append(run(case))
        except ValueError as e:  # transformers refuses the pairing (Gemma 2 with sdpa)
            rows.append({**case, "error": str(e).split(". ")[0]})
            continue
        print(case, rows[-1]["calls"][0]["peak"], file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "configs": CONFIGS, "cases": rows}))


if __name__ == "__main__":
    main()

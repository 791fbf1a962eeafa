#!/usr/bin/env python3
"""What one training step of a Hugging Face transformers model allocates
and frees, op by op, on the CPU: each aten op's new storages (bytes rounded
up to the caching allocator's 512-byte blocks) and when each dies
(`step_trace.Live`), for small models of every supported family, float32
and bfloat16, eager and sdpa attention, with and without non-reentrant
gradient checkpointing and peft's LoRA (its default target modules for the
model type, r=4; Phi-3's fused `qkv_proj`, which peft has no default for), and
GPT-2 with its config class's default dropout of 0.1 (`gpt2-dropout`). The step is `model(input_ids=ids, labels=ids).loss`,
`backward()`, AdamW's `step()`, `zero_grad(set_to_none=True)`; the second
step is traced (the optimizer's state exists), with the event at which the
forward returned and the backward ended.

    python3 tests/reference/hf_train.py > tests/reference/hf_train.json

Needs PyTorch, transformers and peft (CPU builds; versions written in the output).
"""
import json
import sys

import peft
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from hf_generate import CONFIGS, DTYPES, SMALL_MODELS
import step_trace
from step_trace import Live

BATCH, SEQ = 2, 32
# GPT-2 as its config class defaults it: dropout 0.1 on the embeddings, the
# residual branches and the attention weights.
GPT2_DROPOUT = {k: v for k, v in CONFIGS["gpt2"].items() if not k.endswith("pdrop")}
MODELS = {**{m: CONFIGS[m] for m in SMALL_MODELS}, "gpt2-dropout": GPT2_DROPOUT}
CASES = [dict(model=m, dtype=d, attn=a, checkpointing=c, lora=l)
         for m in MODELS for d in ("float32", "bfloat16") for a in ("eager", "sdpa")
         for c in (False, True) for l in (0, 4)]


def build(case):
    torch.manual_seed(0)
    config = AutoConfig.for_model(**MODELS[case["model"]], bos_token_id=None, eos_token_id=None,
                                  pad_token_id=None)
    model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[case["dtype"]],
                                             attn_implementation=case["attn"])
    if case["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case["lora"]:
        targets = ["qkv_proj"] if case["model"] == "phi3" else None
        model = peft.get_peft_model(model, peft.LoraConfig(r=case["lora"], lora_alpha=2 * case["lora"],
                                                           lora_dropout=0.0, target_modules=targets))
    model.train()
    return model, config.vocab_size


def two_steps(model, opt, ids, amp=None, set_to_none=True):
    """Two training steps of `model` on `ids` (the forward and the loss
    under `step_trace.autocast(amp)`, `backward()` outside it; each ends
    with `zero_grad(set_to_none=...)`), the second traced: its peak and
    what it left over what lived before it, the event at which the forward
    returned and the backward ended, and its events."""
    live = Live()
    marks = {}

    def step(traced):
        with step_trace.autocast(amp):
            loss = model(input_ids=ids, labels=ids).loss
        if traced:
            marks["forward_end"] = len(live.ops)
        loss.backward()
        if traced:
            marks["backward_end"] = len(live.ops)
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        return loss.item()

    step(False)
    with live:
        before = live.live
        step(True)
    return {"batch": BATCH, "seq": SEQ, "peak": live.peak - before, "after": live.live - before,
            **marks, "events": live.ops}


def run(case):
    model, vocab = build(case)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, vocab, (BATCH, SEQ))
    return {**case, **two_steps(model, opt, ids)}


def main():
    rows = []
    for case in CASES:
        try:
            rows.append(run(case))
        except (ValueError, RuntimeError) as e:  # a pairing transformers refuses
            rows.append({**case, "error": str(e).split(". ")[0]})
            continue
        print(case, rows[-1]["peak"], file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "configs": MODELS,
                      "cases": rows}))


if __name__ == "__main__":
    main()

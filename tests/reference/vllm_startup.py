#!/usr/bin/env python3
"""vLLM's start-up on this GPU for the planner's shapes, with dummy weights
(load_format="dummy": the published config.json numbers, no download): the
KV-cache size and concurrency vLLM logs, and the blocks it allocated.

    python3 tests/reference/vllm_startup.py OUT_DIR

writes one JSON line per case to stdout (the log lines about memory, and the
engine's numbers) and each case's whole log to OUT_DIR. Where vLLM is not
installed it says so and exits 0.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
KNOWN = os.path.join(HERE, "..", "..", "shared", "src", "train", "hf", "known.json")
CASES = [
    dict(model="Qwen2.5-0.5B", gpu_memory_utilization=0.9, max_model_len=4096, max_num_seqs=256),
    dict(model="Llama-3.1-8B", gpu_memory_utilization=0.9, max_model_len=8192, max_num_seqs=256),
    dict(model="Llama-3.1-8B", gpu_memory_utilization=0.5, max_model_len=8192, max_num_seqs=64),
    dict(model="Mistral-7B-v0.3", gpu_memory_utilization=0.9, max_model_len=32768, max_num_seqs=256),
]
# One case, run in its own process so each start-up has the whole GPU.
CHILD = r"""
import json, sys
from vllm import LLM
case = json.loads(sys.argv[1])
llm = LLM(model=case["path"], load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
          dtype="bfloat16", gpu_memory_utilization=case["gpu_memory_utilization"],
          max_model_len=case["max_model_len"], max_num_seqs=case["max_num_seqs"])
config = llm.llm_engine.vllm_config.cache_config
print("VRAMLAB " + json.dumps({"num_gpu_blocks": config.num_gpu_blocks, "block_size": config.block_size}))
"""
WORDS = ("memory", "KV cache", "kv cache", "blocks", "concurrency", "Available", "profil", "CUDA graph",
         "Loading", "weights")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    try:
        import vllm
    except ImportError as e:
        print(json.dumps({"vllm": None, "missing": str(e)}))
        return
    known = {m["name"]: m["config"] for m in json.load(open(KNOWN))}
    for case in CASES:
        folder = tempfile.mkdtemp(prefix="vramlab-vllm-")
        config = dict(known[case["model"]], torch_dtype="bfloat16",
                      architectures=[ARCHITECTURES[known[case["model"]]["model_type"]]])
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        run = subprocess.run([sys.executable, "-c", CHILD, json.dumps({**case, "path": folder})],
                             capture_output=True, text=True, timeout=240)
        log = run.stdout + run.stderr
        with open(os.path.join(out, f"vllm-{case['model']}-{case['gpu_memory_utilization']}.log"), "w") as f:
            f.write(log)
        numbers = [json.loads(line[8:]) for line in log.splitlines() if line.startswith("VRAMLAB ")]
        print(json.dumps({"vllm": vllm.__version__, **case, "exit": run.returncode,
                          "engine": numbers[0] if numbers else None,
                          "log": [line for line in log.splitlines() if any(w in line for w in WORDS)]}),
              flush=True)


ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                 "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel"}

if __name__ == "__main__":
    main()

"""vllm: `LLM(model, ...)` starts vLLM 0.33.0's engine core, as vLLM does
by default, in a process of its own on the GPU: it loads the weights,
runs its profile, gives the KV cache what is left of
`gpu_memory_utilization` of the card and captures its CUDA graphs. That
memory is the other process's: `torch.cuda.memory_allocated()` here does
not move, nvidia-smi does. It prints the start-up lines vLLM logs, raises
vLLM's ValueError where vLLM refuses to start, and when the last reference
to the `LLM` goes, its finalizer shuts the engine core down and the
process's exit gives the driver everything back. Generation runs inside
the KV cache vLLM already holds: `generate` changes no number here."""

import json
import os

import vramlab_shim as _vs

__version__ = "0.33.0+vramlab"


class SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


def _model(model):
    """A shipped shape's name or repository, or a folder's config.json."""
    path = os.path.join(str(model), "config.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    return str(model)


def _gib(n):
    return "%.2f" % (n / 2**30)


class LLM(_vs.Owner):
    """`vllm.LLM`: its engine core holds the memory, in its own process."""

    def __init__(self, model, *, gpu_memory_utilization=0.9, max_model_len=None, max_num_seqs=None,
                 max_num_batched_tokens=None, kv_cache_dtype="auto", enforce_eager=False, dtype="auto",
                 **kwargs):
        cmd = _vs.command("serve", name=_vs.fresh_name("llm"), model=_model(model), gpu_memory_utilization=gpu_memory_utilization)
        for key, value in (("max_model_len", max_model_len), ("max_num_seqs", max_num_seqs),
                           ("max_num_batched_tokens", max_num_batched_tokens)):
            if value is not None:
                cmd[key] = int(value)
        if kv_cache_dtype != "auto":
            cmd["kv_cache_dtype"] = str(kv_cache_dtype)
        if enforce_eager:
            cmd["enforce_eager"] = True
        if dtype != "auto":
            cmd["dtype"] = str(dtype).replace("torch.", "")
        try:
            record = _vs.make(cmd)
        except _vs.EngineError as e:
            raise ValueError(str(e)) from None
        self._name = cmd["name"]
        v = record["value"]
        print("INFO Model loading took %.4f GiB memory" % (v["weights_bytes"] / 2**30))
        print("INFO Available KV cache memory: %s GiB" % _gib(v["available_kv_bytes"]))
        print("INFO GPU KV cache size: {:,} tokens".format(v["kv_tokens"]))
        print("INFO Maximum concurrency for {:,} tokens per request: {:.2f}x".format(
            v["max_model_len"], v["max_concurrency"]))

    def generate(self, prompts, sampling_params=None, **kwargs):
        _vs.note("vLLM generates inside the KV cache it already holds: no number moves, and no text is made here")
        return []

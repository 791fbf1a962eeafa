#!/usr/bin/env python3
"""Replays a vramlab command file in real PyTorch on a CUDA GPU and prints one
JSON line per command, with the stats keys `vramlab run` prints.

    python3 tests/reference/replay_pytorch.py FILE.jsonl > FILE.pytorch.jsonl

alloc is torch.empty(n, dtype=torch.uint8, device="cuda") (or shape and
dtype); del, hold (a list; with cycle, it holds itself), gc, empty_cache,
clear_cublas_workspaces, reset_peak_memory_stats; every restart is a fresh Python process whose
settings become PYTORCH_* environment variables. A restart's smaller GPU
(device_total_bytes less its context_bytes) becomes a per-process memory
fraction of the real one: the caching allocator then runs out of memory,
frees its cache and retries at the same reserved bytes as on that GPU.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import replay  # noqa: E402

STATS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "active_bytes": "active_bytes.all.current",
    "requested_bytes": "requested_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
    "segments": "segment.all.current",
    "allocations": "allocation.all.current",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
    "num_device_alloc": "num_device_alloc",
    "num_device_free": "num_device_free",
}


def environment(env, settings):
    conf = []
    if settings.get("max_split_size_mb"):
        conf.append(f"max_split_size_mb:{settings['max_split_size_mb']}")
    if settings.get("expandable_segments"):
        conf.append("expandable_segments:True")
    if settings.get("roundup_power2_divisions"):
        conf.append(f"roundup_power2_divisions:{settings['roundup_power2_divisions']}")
    if settings.get("garbage_collection_threshold"):
        conf.append(f"garbage_collection_threshold:{settings['garbage_collection_threshold']}")
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = env["PYTORCH_ALLOC_CONF"] = ",".join(conf)
    if settings.get("no_caching"):
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    if settings.get("cublas_workspace_config") is not None:
        env["CUBLAS_WORKSPACE_CONFIG"] = settings["cublas_workspace_config"]
    return env


class PyTorch(replay.Framework):
    def __init__(self, settings):
        import torch

        self.torch = torch
        torch.cuda.init()
        if settings.get("per_process_memory_fraction") is not None:
            torch.cuda.set_per_process_memory_fraction(float(settings["per_process_memory_fraction"]))
        elif settings.get("device_total_bytes") is not None:
            # allowed = floor(fraction * total): half a byte over the room.
            room = int(settings["device_total_bytes"]) - int(settings.get("context_bytes", 0))
            total = torch.cuda.get_device_properties(0).total_memory
            if room < total:
                torch.cuda.set_per_process_memory_fraction((room + 0.5) / total)

    def alloc(self, cmd):
        t = self.torch
        if "bytes" in cmd:
            return t.empty(int(cmd["bytes"]), dtype=t.uint8, device="cuda")
        return t.empty(*cmd["shape"], dtype=getattr(t, cmd.get("dtype", "float32")), device="cuda")

    def empty_cache(self):
        self.torch.cuda.empty_cache()

    def clear_cublas_workspaces(self):
        self.torch._C._cuda_clearCublasWorkspaces()

    def reset_peaks(self):
        self.torch.cuda.reset_peak_memory_stats()

    def stats(self):
        s = self.torch.cuda.memory_stats()
        out = {k: int(s.get(v, 0)) for k, v in STATS.items()}
        out["device_free_bytes"], out["device_total_bytes"] = self.torch.cuda.mem_get_info()
        return out

    def out_of_memory(self, error):
        return isinstance(error, self.torch.OutOfMemoryError)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--process":
        settings = json.loads(sys.argv[3])
        if settings.get("framework", "pytorch") != "pytorch":
            sys.exit("not a PyTorch kernel: replay it with its own framework")
        replay.play(PyTorch(settings), int(sys.argv[2]), sys.stdin.readlines())
    elif len(sys.argv) == 2:
        replay.drive(__file__, sys.argv[1], environment)
    else:
        sys.exit(__doc__)

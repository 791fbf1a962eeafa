#!/usr/bin/env python3
"""What a CUDA context costs on this GPU, and how it grows as PyTorch loads
cuBLAS, cuDNN and its attention kernels (or as JAX starts): the device's
used memory from NVML before the process touches the GPU and after each
stage, with the framework's own reserved bytes, so that the context is
used - used before - reserved. Prints JSON lines, one per stage.

    python3 tests/reference/gpu_context.py torch > tests/golden/context-torch.jsonl
    python3 tests/reference/gpu_context.py jax > tests/golden/context-jax.jsonl
"""
import json
import os
import sys

import pynvml

pynvml.nvmlInit()
HANDLE = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or 0))
BASE = pynvml.nvmlDeviceGetMemoryInfo(HANDLE).used


def report(stage, framework, reserved, extra=None):
    info = pynvml.nvmlDeviceGetMemoryInfo(HANDLE)
    row = {
        "framework": framework,
        "stage": stage,
        "total_bytes": info.total,
        "used_before_bytes": BASE,
        "used_bytes": info.used,
        "reserved_bytes": reserved,
        "context_bytes": info.used - BASE - reserved,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "gpu": pynvml.nvmlDeviceGetName(HANDLE),
        "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING"),
    }
    row.update(extra or {})
    print(json.dumps(row), flush=True)


def torch_stages():
    import torch
    import torch.nn.functional as F

    def r(stage):
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        report(stage, "torch " + torch.__version__, torch.cuda.memory_reserved(),
               {"cuda": torch.version.cuda, "mem_get_info_free": free, "mem_get_info_total": total,
                "allocated_bytes": torch.cuda.memory_allocated()})

    torch.cuda.init()
    x = torch.zeros(1, device="cuda")
    r("first tensor (context)")
    a = torch.randn(1024, 1024, device="cuda")
    a @ a
    r("first float32 matmul (cuBLAS)")
    b = a.bfloat16()
    b @ b
    r("first bfloat16 matmul")
    F.linear(a, a, a[0])
    r("first linear with bias (cuBLASLt)")
    img = torch.randn(8, 32, 64, 64, device="cuda")
    F.conv2d(img, torch.randn(32, 32, 3, 3, device="cuda"), padding=1)
    r("first conv2d (cuDNN)")
    q = torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    r("first bfloat16 sdpa forward and backward (flash)")
    F.cross_entropy(torch.randn(64, 1000, device="cuda"), torch.randint(0, 1000, (64,), device="cuda"))
    r("first cross_entropy")
    del x, a, b, img, q
    torch.cuda.empty_cache()
    r("after empty_cache")


def jax_stages():
    import jax
    import jax.numpy as jnp

    dev = jax.devices("gpu")[0]

    def r(stage):
        s = dev.memory_stats() or {}
        report(stage, "jax " + jax.__version__, int(s.get("pool_bytes", s.get("bytes_reserved", 0))),
               {"bytes_limit": s.get("bytes_limit"), "bytes_in_use": s.get("bytes_in_use"),
                "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
                "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")})

    x = jnp.zeros(1).block_until_ready()
    r("first array (context)")
    a = jnp.ones((1024, 1024))
    jax.jit(lambda a: a @ a)(a).block_until_ready()
    r("first jitted matmul")
    img = jnp.ones((8, 32, 64, 64))
    w = jnp.ones((32, 32, 3, 3))
    jax.jit(lambda x, w: jax.lax.conv(x, w, (1, 1), "SAME"))(img, w).block_until_ready()
    r("first jitted convolution")
    del x


if __name__ == "__main__":
    {"torch": torch_stages, "jax": jax_stages}[sys.argv[1]]()

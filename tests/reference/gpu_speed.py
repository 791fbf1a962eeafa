#!/usr/bin/env python3
"""PyTorch eager's side of the speed ratio on a CUDA GPU: the bfloat16
matrix product's measured ceiling (8192^3), and the time of a training step
(forward, backward, foreach Adam) of the default MLP (2 x 128, input 784,
batch 64), of an 8 x 8192 MLP at batch 1024 in bfloat16, and of the 12 x 768
transformer (step_trace.py's Gpt with SDPA, and with its attention written
out, vocabulary 50257, sequence 1024, batch 8) under bfloat16 autocast: the median of 20 timed steps after 5
warm-up steps, CUDA events. Prints JSON.

    python3 tests/reference/gpu_speed.py > tests/golden/speed-pytorch.json
"""
import json
import statistics

import torch
import torch.nn.functional as F

import cuda_events

cuda_events.without_cpu_autocast()
from param_counts import mlp  # noqa: E402
from step_trace import Gpt  # noqa: E402


def timed(fn, warmup=5, runs=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    return statistics.median(times)


def ceiling():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    s = timed(lambda: a @ a, 3, 10)
    return 2 * 8192**3 / s / 1e12


def step_time(model, x, y, flat, amp, flops_per_sample):
    opt = torch.optim.Adam(model.parameters(), foreach=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            out = model(x)
            loss = F.cross_entropy(out.flatten(0, 1) if flat else out, y.flatten() if flat else y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    s = timed(step)
    params = sum(p.numel() for p in model.parameters())
    flops = 6 * params * flops_per_sample
    return {"seconds": s, "parameters": params, "model_tflops": flops / s / 1e12}


def main():
    torch.manual_seed(0)
    rows = {"bf16_matmul_tflops": ceiling()}
    torch.set_default_device("cuda")
    m = mlp(2, 128, 784, 10)
    rows["mlp 2x128 batch 64"] = step_time(m, torch.randn(64, 784, device="cuda"),
                                           torch.randint(0, 10, (64,), device="cuda"), False, False, 64)
    m = mlp(8, 8192, 8192, 8192).bfloat16()
    rows["mlp 8x8192 batch 1024 bf16"] = step_time(
        m, torch.randn(1024, 8192, device="cuda", dtype=torch.bfloat16),
        torch.randint(0, 8192, (1024,), device="cuda"), False, False, 1024)
    del m
    g = Gpt(layers=12, width=768, heads=12, seq_len=1024, vocab=50257, fused=True, checkpointing=False)
    ids = torch.randint(0, 50257, (8, 1024), device="cuda")
    rows["transformer 12x768 batch 8 seq 1024 bf16 autocast"] = step_time(g, ids, ids, True, True, 8 * 1024)
    del g
    # The same with attention written out (vramlab's kernels have no fused
    # attention): softmax(q @ k.T * scale, masked) @ v.
    g = Gpt(layers=12, width=768, heads=12, seq_len=1024, vocab=50257, fused=False, checkpointing=False)
    rows["transformer 12x768 batch 8 seq 1024 bf16 autocast, eager attention"] = step_time(
        g, ids, ids, True, True, 8 * 1024)
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                      "gpu": torch.cuda.get_device_name(), "steps": rows}, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What PyTorch's matrix products, attention and convolutions allocate
beside their outputs on a CUDA GPU (cuBLAS and cuBLASLt workspaces,
cuDNN's, attention's log-sum-exp): each op run three times in a row on
inputs made before it, each run's allocator events recorded
(cuda_events.py). Prints JSON.

    python3 tests/reference/gpu_workspaces.py > tests/golden/workspaces.json

The environment it runs in is part of the answer (TORCH_CUBLAS_WORKSPACE_CACHE,
TORCH_CUBLASLT_UNIFIED_WORKSPACE, CUBLAS_WORKSPACE_CONFIG): gpu-check.sh runs
it under each, and the file names them.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

import cuda_events

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ENV = ("TORCH_CUBLAS_WORKSPACE_CACHE", "TORCH_CUBLASLT_UNIFIED_WORKSPACE", "CUBLAS_WORKSPACE_CONFIG",
       "CUBLASLT_WORKSPACE_SIZE", "PYTORCH_CUDA_ALLOC_CONF")


def ops(dtype):
    """name -> (inputs maker, op): the op is timed on the inputs."""
    def t(*shape, grad=False):
        return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=grad)

    def linear_backward(x, w, b):
        F.linear(x, w, b).sum().backward()

    def sdpa_backward(q, k, v):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    def conv_backward(x, w):
        F.conv2d(x, w, padding=1).sum().backward()

    return {
        "mm 1024x1024x1024": (lambda: (t(1024, 1024), t(1024, 1024)), torch.mm),
        "mm 4096x4096x4096": (lambda: (t(4096, 4096), t(4096, 4096)), torch.mm),
        "addmm (linear with bias) 256x1024x1024": (lambda: (t(256, 1024), t(1024, 1024), t(1024)), F.linear),
        "linear without bias 256x1024x1024": (lambda: (t(256, 1024), t(1024, 1024)), F.linear),
        "bmm 8x512x64x512": (lambda: (t(8, 512, 64), t(8, 64, 512)), torch.bmm),
        "linear forward and backward 256x1024x1024": (
            lambda: (t(256, 1024, grad=True), t(1024, 1024, grad=True), t(1024, grad=True)), linear_backward),
        "sdpa causal forward 4x8x1024x64": (
            lambda: (t(4, 8, 1024, 64), t(4, 8, 1024, 64), t(4, 8, 1024, 64)),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "sdpa causal forward and backward 4x8x1024x64": (
            lambda: (t(4, 8, 1024, 64, grad=True), t(4, 8, 1024, 64, grad=True), t(4, 8, 1024, 64, grad=True)),
            sdpa_backward),
        "conv2d 3x3 16x64x56x56": (lambda: (t(16, 64, 56, 56), t(64, 64, 3, 3)), lambda x, w: F.conv2d(x, w, padding=1)),
        "conv2d 3x3 forward and backward 16x64x56x56": (
            lambda: (t(16, 64, 56, 56, grad=True), t(64, 64, 3, 3, grad=True)), conv_backward),
    }


def main():
    rows = []
    for dname, dtype in DTYPES.items():
        for name, (make, op) in ops(dtype).items():
            inputs = make()
            runs = []
            for _ in range(3):
                row, out = cuda_events.measure(lambda: op(*inputs))
                row["output_bytes"] = out.untyped_storage().nbytes() if isinstance(out, torch.Tensor) else 0
                del out
                for x in inputs:
                    x.grad = None
                runs.append(row)
            rows.append({"op": name, "dtype": dname, "runs": runs})
            del inputs
            print(name, dname, [r["peak_over_before"] for r in runs], file=sys.stderr)
    print(json.dumps({
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "environment": {k: os.environ.get(k) for k in ENV},
        "ops": rows,
    }, indent=1))


if __name__ == "__main__":
    cuda_events.start()
    main()

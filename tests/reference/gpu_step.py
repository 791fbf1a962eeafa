#!/usr/bin/env python3
"""A training step of each model kind on a CUDA GPU, as step_trace.py traces
it on the CPU (the same cases, models and loop: two steps of `loss =
criterion(model(x), y)`, `loss.backward()`, foreach Adam, `zero_grad()`),
with real `torch.autocast("cuda")`; the second step measured by the caching
allocator itself (cuda_events.py): allocated before, the peak over it, the
bytes it leaves, and every allocator event (workspaces included). Prints JSON.

    python3 tests/reference/gpu_step.py > tests/golden/gpu_step.json
"""
import json
import platform
import sys

import torch
import torch.nn.functional as F

import cuda_events

# step_trace.py plays CUDA's autocast on the CPU; here CUDA runs its own.
sys.modules["cuda_autocast"] = type(sys)("cuda_autocast")
sys.modules["cuda_autocast"].Autocast = lambda half: None
sys.modules["cuda_autocast"].emulate = None
from step_trace import CASES, divided, run  # noqa: E402


def on_gpu(build, batch_of, flat, amp=None, accumulate=1):
    torch.manual_seed(0)
    model = build().cuda()
    x, y = (t.cuda() for t in batch_of())
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(amp)

    def step():
        loss = None
        for _ in range(accumulate):
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                logits = model(x) if not flat else model(x).flatten(0, 1)
                loss = divided(F.cross_entropy(logits, y.flatten()), accumulate)
                del logits
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    first, loss = cuda_events.measure(step)
    # The first step's loss lives until the second's is bound, as in a loop.
    second, loss = cuda_events.measure(step)
    return {
        "first_step_peak_bytes": first["peak_over_before"],
        "peak_bytes": second["peak_over_before"],
        "net_bytes": second["allocated_after"] - second["allocated_before"],
        "allocated_before": second["allocated_before"],
        "reserved_after": second["reserved_after"],
        # float16 weights under Adam reach NaN (eps 1e-8 is 0 in float16).
        "loss": loss.item() if torch.isfinite(loss) else None,
        "events": second["events"],
    }


if __name__ == "__main__":
    cuda_events.start()
    steps = []
    for k, shape, data in CASES:
        try:
            row = {"kind": k, **shape, **data, **run(k, shape, data, trace=on_gpu)}
        except Exception as e:  # noqa: BLE001 - a failing case is written, the others go on
            row = {"kind": k, **shape, **data, "error": f"{type(e).__name__}: {e}"}
        print(k, shape, data, row.get("peak_bytes"), row.get("error", ""), file=sys.stderr)
        steps.append(row)
        torch.cuda.empty_cache()
    print(json.dumps({
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(),
        "steps": steps,
    }))

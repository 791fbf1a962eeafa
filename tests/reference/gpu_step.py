#!/usr/bin/env python3
"""A training step of each model kind on a CUDA GPU, as step_trace.py traces
it on the CPU (the same cases, models and loop: two steps of `loss =
criterion(model(x), y)`, `loss.backward()`, foreach Adam, `zero_grad()`),
with real `torch.autocast("cuda")`; the second step measured by the caching
allocator itself (cuda_events.py): allocated before, the peak over it, the
bytes it leaves, and every allocator event (workspaces included). Prints JSON.

    python3 tests/reference/gpu_step.py > tests/golden/gpu_step.json
    python3 tests/reference/gpu_step.py 4 8 > tests/golden/gpu_step-detail.json

Given case numbers, only those run (the first step's events kept too), and
each event keeps the 4 innermost frames under the allocator's own, C++ ones
included (`stacks="all"`): which kernel asked for it.
"""
import json
import platform
import sys

import torch
import torch.nn.functional as F

import cuda_events

cuda_events.without_cpu_autocast()
from step_trace import CASES, divided, run  # noqa: E402


def on_gpu(build, batch_of, flat, amp=None, accumulate=1):
    torch.manual_seed(0)
    model = build().cuda()
    x, y = (t.cuda() for t in batch_of())
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(amp)

    state = {}

    def step():
        for _ in range(accumulate):
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                logits = model(x) if not flat else model(x).flatten(0, 1)
                # One statement: the last loss dies when the new one is bound.
                state["loss"] = divided(F.cross_entropy(logits, y.flatten()), accumulate)
                del logits
            state["loss"].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    first, _ = cuda_events.measure(step)
    second, _ = cuda_events.measure(step)
    loss = state["loss"]
    return {
        "first_step_peak_bytes": first["peak_over_before"],
        "peak_bytes": second["peak_over_before"],
        "net_bytes": second["allocated_after"] - second["allocated_before"],
        "allocated_before": second["allocated_before"],
        "reserved_after": second["reserved_after"],
        # float16 weights under Adam reach NaN (eps 1e-8 is 0 in float16).
        "loss": loss.item() if torch.isfinite(loss) else None,
        "events": second["events"],
        **({"first_step_events": first["events"]} if DETAIL else {}),
    }


DETAIL = len(sys.argv) > 1

if __name__ == "__main__":
    only = [int(a) for a in sys.argv[1:]]
    if only:
        cuda_events.start(stacks="all", frames=4)
    else:
        cuda_events.start()
    steps = []
    for i, (k, shape, data) in enumerate(CASES):
        if only and i not in only:
            continue
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

"""The caching allocator's own record of what a piece of code did on a CUDA
GPU: `torch.cuda.memory._record_memory_history` around it, then the trace
entries it added (action and size, PyTorch's names), with
`memory_allocated` before and after and `max_memory_allocated` over it.
Used by the GPU reference scripts (gpu_workspaces.py, gpu_step.py,
hf_steps.py)."""
import sys

import torch

def without_cpu_autocast():
    """step_trace.py plays CUDA's autocast on the CPU (cuda_autocast.py);
    on a GPU CUDA runs its own: call this before importing step_trace."""
    stub = type(sys)("cuda_autocast")
    stub.Autocast = lambda half: None
    stub.emulate = None
    sys.modules.setdefault("cuda_autocast", stub)


KEPT = ("alloc", "free_requested", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")


FRAMES = 1
# The allocator's own C++ frames and the tensor factories under every
# allocation: not what asked for it.
OWN = ("unwind", "CapturedTraceback", "gather", "CachingAllocator", "c10::", "at::TensorBase::",
       "at::empty", "at::detail::empty", "at::native::empty", "at::_ops::empty", "at::(anonymous")


def asked_by(frames):
    """The frames under the allocator's own."""
    return [f for f in frames if not any(o in f for o in OWN)]


def start(stacks="python", frames=1):
    """Records from now on; with stacks="all" (C++ frames too) each event
    keeps the `frames` innermost names under the allocator's own."""
    global FRAMES
    FRAMES = frames
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks=stacks)


def stop():
    torch.cuda.memory._record_memory_history(enabled=None)


def trace_len():
    traces = torch.cuda.memory._snapshot()["device_traces"]
    return len(traces[torch.cuda.current_device()]) if traces else 0


def events_since(n):
    """[action, size, innermost function] of each entry after the first n
    (the FRAMES innermost, joined by " < ", where more are kept)."""
    trace = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    out = []
    for e in trace[n:]:
        if e["action"] in KEPT:
            frames = e.get("frames") or []
            names = [f["name"] for f in frames]
            if FRAMES > 1:
                names = asked_by(names)
            out.append([e["action"], e["size"], " < ".join(n[:160] for n in names[:FRAMES])])
    return out


def measure(fn):
    """Runs fn() once with the allocator recording; returns what it did
    and fn's result."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    reserved_before = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    n = trace_len()
    result = fn()
    torch.cuda.synchronize()
    row = {
        "allocated_before": before,
        "allocated_after": torch.cuda.memory_allocated(),
        "peak_over_before": torch.cuda.max_memory_allocated() - before,
        "reserved_before": reserved_before,
        "reserved_after": torch.cuda.memory_reserved(),
        "events": events_since(n),
    }
    return row, result

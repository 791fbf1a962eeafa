"""torch.cuda: the caching allocator's numbers, read from the engine."""

import vramlab_shim as _vs
from torch.cuda import amp  # noqa: F401


class OutOfMemoryError(RuntimeError):
    pass


_vs.raises("out_of_memory", OutOfMemoryError)
_vs.raises("runtime_error", RuntimeError)
_vs.raises("invalid_value", ValueError)


def is_available():
    return True


def device_count():
    return 1


def current_device():
    return 0


def set_device(d):
    pass


def synchronize(device=None):
    pass


def get_device_name(device=None):
    return _vs.device_name()


def _s(key):
    return _vs.stats()[key]


def memory_allocated(device=None):
    return _s("allocated_bytes")


def memory_reserved(device=None):
    return _s("reserved_bytes")


def max_memory_allocated(device=None):
    return _s("peak_allocated_bytes")


def max_memory_reserved(device=None):
    return _s("peak_reserved_bytes")


memory_cached = memory_reserved
max_memory_cached = max_memory_reserved


def mem_get_info(device=None):
    s = _vs.stats()
    return (s["device_free_bytes"], s["device_total_bytes"])


def memory_stats(device=None):
    s = _vs.stats()
    out = {}
    for key, value in (
        ("allocated_bytes", s["allocated_bytes"]),
        ("reserved_bytes", s["reserved_bytes"]),
        ("active_bytes", s["active_bytes"]),
        ("requested_bytes", s["requested_bytes"]),
        ("inactive_split_bytes", s["inactive_split_bytes"]),
    ):
        out[key + ".all.current"] = value
    out["allocated_bytes.all.peak"] = s["peak_allocated_bytes"]
    out["reserved_bytes.all.peak"] = s["peak_reserved_bytes"]
    out["segment.all.current"] = s["segments"]
    out["num_alloc_retries"] = s["num_alloc_retries"]
    out["num_ooms"] = s["num_ooms"]
    out["num_device_alloc"] = s["num_device_alloc"]
    out["num_device_free"] = s["num_device_free"]
    return out


def _mib(b):
    if b >= 1 << 30:
        return "%.2f GiB" % (b / (1 << 30))
    if b >= 1 << 20:
        return "%d MiB" % (b // (1 << 20))
    if b >= 1 << 10:
        return "%d KiB" % (b // (1 << 10))
    return "%d B" % b


def memory_summary(device=None, abbreviated=False):
    """PyTorch's table, with the rows vramlab's engine counts."""
    s = _vs.stats()
    rule = "|" + "=" * 75 + "|"
    line = "|" + "-" * 75 + "|"
    rows = [
        rule,
        "|                  PyTorch CUDA memory summary, device ID 0                 |",
        line,
        "|            CUDA OOMs: %-4d      |        cudaMalloc retries: %-4d        |"
        % (s["num_ooms"], s["num_alloc_retries"]),
        rule,
        "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
        line,
    ]
    for label, cur, peak in (
        ("Allocated memory", s["allocated_bytes"], s["peak_allocated_bytes"]),
        ("Active memory", s["active_bytes"], s["peak_allocated_bytes"]),
        ("Requested memory", s["requested_bytes"], s["peak_allocated_bytes"]),
        ("GPU reserved memory", s["reserved_bytes"], s["peak_reserved_bytes"]),
        ("Non-releasable memory", s["inactive_split_bytes"], s["inactive_split_bytes"]),
    ):
        rows.append("| %-21s | %10s | %10s | %10s | %10s |" % (label, _mib(cur), _mib(peak), "", ""))
    rows.append(line)
    rows.append("| %-21s | %10d | %10d | %10s | %10s |" % ("GPU reserved segments", s["segments"], s["segments"], "", ""))
    rows.append(rule)
    return "\n".join(rows) + "\n"


def empty_cache():
    _vs.run(_vs.command("empty_cache"))


def reset_peak_memory_stats(device=None):
    _vs.run(_vs.command("reset_peak_memory_stats"))


reset_max_memory_allocated = reset_peak_memory_stats


class memory:
    @staticmethod
    def _record_memory_history(*a, **k):
        pass

    @staticmethod
    def _dump_snapshot(*a, **k):
        _vs.note("_dump_snapshot: use the page's Export snapshot to download the session as a memory snapshot")

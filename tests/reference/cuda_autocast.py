"""CUDA's autocast, played on the CPU, for recording what a training step
allocates under `torch.autocast('cuda', dtype=...)` without a GPU.

PyTorch registers one autocast kernel per op and per device. CUDA's policy
(`aten/src/ATen/autocast_mode.{h,cpp}`) is read from the lists in the
installed `ATen/autocast_mode.h`: the `lower_precision_fp` ops (matrix
products, convolutions, attention) cast every floating input to the
autocast type; the `fp32` ops (LayerNorm, RMSNorm, the losses, exp, log...)
to float32; the `fp32_set_opt_dtype` ops (softmax, log_softmax, sum...) ask
for a float32 result unless one is asked for; a few ops `promote` to the
widest input type. `cached_cast` keeps the cast of a float32 leaf that
requires a gradient (a weight) until the outermost autocast region exits.
This module installs exactly that policy as the CPU's autocast kernels,
and makes the CPU-only kernels (for example `cross_entropy_loss` in float32)
fall through, so that a model run under `torch.autocast('cpu')` dispatches
as it would under CUDA's.

The CPU computes in bfloat16 (its autocast type). Casts to float16 on CUDA
differ in one kernel: `softmax(x, dtype=float32)` of a float16 `x` runs
`_softmax(x, half_to_float=True)`, one float32 result and no float32 copy
of `x` (`softmax` in `aten/src/ATen/native/SoftMax.cpp`), and its backward
returns float16. With `half=True` the kernels here call that op, and
`emulate` computes it (the caller records only its result).
"""
import os
import re

import torch
from torch.library import Library, fallthrough_kernel
from torch.utils._pytree import tree_flatten, tree_unflatten

HEADER = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")

# Registered for CUDA in autocast_mode.cpp rather than in the header's lists.
LOWER = {"cudnn_convolution", "cudnn_convolution_transpose"}
PROMOTE = {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put", "scatter_add", "tensordot"}
LISTS = {
    "AT_FORALL_LOWER_PRECISION_FP": "lower",
    "AT_FORALL_FP32": "fp32",
    "AT_FORALL_FP32_SET_OPT_DTYPE": "fp32_set_opt_dtype",
}


def policies():
    """`aten::name.overload` -> CUDA's cast policy, from the header."""
    header = open(HEADER).read()
    out = {}
    for macro, policy in LISTS.items():
        body = re.search(r"#define %s\(_\)(.*?)\n\n" % macro, header, re.S).group(1)
        for entry in re.findall(r"_\(([^()]*?)\)", body):
            parts = [p.strip() for p in entry.split(",")]
            out["aten::" + ".".join(parts)] = policy
    for name in LOWER:
        out["aten::" + name] = "lower"
    for name in PROMOTE:
        out["aten::" + name] = "promote"
    return out


class Autocast:
    """The installed kernels and the cast cache."""

    def __init__(self, half):
        self.half = half
        self.cache = {}
        self.lib = Library("aten", "IMPL")
        self.policy = policies()
        cuda = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA"))
        cpu = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"))
        for name in sorted(cuda | cpu):
            short = name.split("::")[1]
            if name in cuda and name in self.policy:
                self.lib.impl(short, self.kernel(name), "AutocastCPU")
            elif name in cuda:
                self.lib.impl(short, self.unsupported(name), "AutocastCPU")
            else:
                self.lib.impl(short, fallthrough_kernel, "AutocastCPU")
        clear = torch.clear_autocast_cache

        def clear_both():
            self.cache.clear()
            clear()

        torch.clear_autocast_cache = clear_both

    @staticmethod
    def overload(name):
        packet, _, overload = name.split("::")[1].partition(".")
        return getattr(getattr(torch.ops.aten, packet), overload or "default")

    def unsupported(self, name):
        def kernel(*args, **kwargs):
            raise NotImplementedError(f"CUDA's autocast policy for {name} is not played here")

        return kernel

    def kernel(self, name):
        op, policy = self.overload(name), self.policy[name]
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

        def kernel(*args, **kwargs):
            with torch._C._ExcludeDispatchKeyGuard(keys):
                if policy == "fp32_set_opt_dtype":
                    return self.set_opt_dtype(op, args, kwargs)
                to = {"lower": torch.get_autocast_dtype("cpu"), "fp32": torch.float32}.get(policy)
                if policy == "promote":
                    to = self.widest(args, kwargs)
                args, kwargs = self.cast_all(to, (args, kwargs))
                return op(*args, **kwargs)

        return kernel

    @staticmethod
    def eligible(t):
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64

    def cast(self, to, t):
        """`cached_cast`: casts of float32 weights are kept until the
        outermost autocast region exits."""
        if to is None or not self.eligible(t) or t.dtype == to:
            return t
        cacheable = (
            to == torch.get_autocast_dtype("cpu")
            and t.dtype == torch.float32
            and t.requires_grad
            and t.is_leaf
            and not t._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if not cacheable:
            return t.to(to)
        hit = self.cache.get(id(t))
        if hit is None or hit[0] is not t:
            hit = (t, t.to(to))
            self.cache[id(t)] = hit
        return hit[1]

    def cast_all(self, to, tree):
        """Casts every input, the last first: the order in which the
        compiler of a Linux build evaluates `cached_cast(args)...`."""
        leaves, spec = tree_flatten(tree)
        cast = [self.cast(to, t) for t in reversed(leaves)]
        return tree_unflatten(list(reversed(cast)), spec)

    def widest(self, args, kwargs):
        types = [t.dtype for t in torch.utils._pytree.tree_leaves((args, kwargs)) if self.eligible(t)]
        return torch.float32 if torch.float32 in types else (types[0] if types else None)

    def set_opt_dtype(self, op, args, kwargs):
        """Softmax and friends: a float32 result unless a type is asked for;
        a float16 input's softmax converts inside the kernel."""
        first = next((t for t in torch.utils._pytree.tree_leaves(args) if isinstance(t, torch.Tensor)), None)
        if not self.eligible(first):
            return op(*args, **kwargs)
        names = [a.name for a in op._schema.arguments]
        i = names.index("dtype")
        args = list(args)
        if i < len(args):
            args[i] = torch.float32 if args[i] is None else args[i]
            asked = args[i]
        else:
            kwargs = {**kwargs, "dtype": kwargs.get("dtype") or torch.float32}
            asked = kwargs["dtype"]
        packet = op._schema.name.split("::")[1]
        if self.half and packet in ("softmax", "log_softmax") and asked == torch.float32 and first.dtype != torch.float32:
            fused = torch.ops.aten._softmax if packet == "softmax" else torch.ops.aten._log_softmax
            return fused.default(first, args[1], True)
        return op(*args, **kwargs)


HALF_TO_FLOAT = {"_softmax", "_log_softmax"}
HALF_BACKWARD = {"_softmax_backward_data", "_log_softmax_backward_data"}


def emulate(func, args, kwargs):
    """What CUDA's half-to-float softmax kernels return, computed on the
    CPU (whose kernels refuse to convert), or None for any other op."""
    name = func.__name__.split(".")[0]
    if name in HALF_TO_FLOAT and len(args) > 2 and args[2]:
        return func(args[0].float(), args[1], False)
    if name in HALF_BACKWARD and args[0].dtype != args[3]:
        return func(args[0], args[1], args[2], args[0].dtype).to(args[3])
    return None

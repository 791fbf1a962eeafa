"""torch.nn: modules as PyTorch builds them (parameters on the CPU until
moved). A model the engine knows (an nn.Sequential, or a Module whose
layers are Linear and ReLU, of equal hidden widths) is moved to the GPU
as the engine's model; its forward, backward and optimizer steps run as
the engine's step program."""

from collections import OrderedDict

import torch
import vramlab_shim as _vs
from torch._tensor import Tensor
from torch.nn import functional  # noqa: F401
from torch.nn.engine import EngineModel, ModelOutput


class Parameter(Tensor):
    def __init__(self, data=None, requires_grad=True):
        t = data if data is not None else torch.empty(0)
        Tensor.__init__(self, t.shape, t.dtype, t.device, storage=t._storage, requires_grad=requires_grad)


class Module:
    def __init__(self, *a, **k):
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_engine", None)
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_modules" not in self.__dict__:
            Module.__init__(self)
        if isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Parameter):
            self._parameters[name] = value
        object.__setattr__(self, name, value)

    def add_module(self, name, module):
        setattr(self, name, module)

    register_module = add_module

    def register_buffer(self, name, tensor, persistent=True):
        object.__setattr__(self, name, tensor)

    def children(self):
        return iter(self._modules.values())

    def modules(self):
        yield self
        for m in self._modules.values():
            yield from m.modules()

    def named_parameters(self, prefix="", recurse=True):
        for n, p in self._parameters.items():
            yield (prefix + n, p)
        for mn, m in self._modules.items():
            yield from m.named_parameters(prefix + mn + ".")

    def parameters(self, recurse=True):
        for _, p in self.named_parameters():
            yield p

    def buffers(self):
        return iter(())

    def state_dict(self):
        return OrderedDict(self.named_parameters())

    def load_state_dict(self, *a, **k):
        return None

    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self

    def zero_grad(self, set_to_none=True):
        if self._engine is not None:
            self._engine.zero_grad(set_to_none)

    def to(self, *args, **kwargs):
        dev = kwargs.get("device")
        dt = kwargs.get("dtype")
        for a in args:
            if isinstance(a, torch.dtype):
                dt = a
            elif a is not None:
                dev = a
        if self._engine is None:
            # On the host a module keeps the type it was given (`.half()`
            # then `.cuda()` puts float16 parameters on the GPU).
            dt = dt or self.__dict__.get("_host_dtype")
            object.__setattr__(self, "_host_dtype", dt)
            if dev is not None and torch.device(dev).type == "cuda":
                object.__setattr__(self, "_engine", EngineModel.place(self, dt))
        return self

    def cuda(self, device=None):
        return self.to("cuda")

    def cpu(self):
        return self

    def half(self):
        return self.to(dtype=torch.float16)

    def float(self):
        return self

    def bfloat16(self):
        return self.to(dtype=torch.bfloat16)

    def __call__(self, *args, **kwargs):
        engine = self._engine
        if engine is not None and args and isinstance(args[0], Tensor):
            return engine.forward(args[0])
        return self.forward(*args, **kwargs)

    def forward(self, x):
        raise NotImplementedError("Module [%s] is missing the required \"forward\" function" % type(self).__name__)

    def __repr__(self):
        inner = "".join("\n  (%s): %r" % (n, m) for n, m in self._modules.items())
        return "%s(%s%s)" % (type(self).__name__, self.extra_repr(), inner + "\n" if inner else "")

    def extra_repr(self):
        return ""


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(torch.empty(out_features, in_features, dtype=dtype))
        self.bias = Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        if device is not None:
            self.to(device)

    def forward(self, x):
        return x._new(tuple(x.shape[:-1]) + (self.out_features,))

    def extra_repr(self):
        return "in_features=%d, out_features=%d, bias=%s" % (self.in_features, self.out_features, self.bias is not None)


def _size(shape):
    return tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        Module.__init__(self)
        shape = _size(normalized_shape)
        if elementwise_affine:
            self.weight = Parameter(torch.empty(*shape, dtype=dtype))
            self.bias = Parameter(torch.empty(*shape, dtype=dtype)) if bias else None

    def forward(self, x):
        return x._new(x.shape)


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        Module.__init__(self)
        if elementwise_affine:
            self.weight = Parameter(torch.empty(*_size(normalized_shape), dtype=dtype))

    def forward(self, x):
        return x._new(x.shape)


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, device=None, dtype=None, **_):
        Module.__init__(self)
        self.embedding_dim = embedding_dim
        self.weight = Parameter(torch.empty(num_embeddings, embedding_dim, dtype=dtype))

    def forward(self, x):
        return x._new(tuple(x.shape) + (self.embedding_dim,))


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


class Conv2d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True, **_):
        Module.__init__(self)
        self.out_channels, self.kernel_size = out_channels, _pair(kernel_size)
        self.stride, self.padding = _pair(stride), _pair(padding)
        self.weight = Parameter(torch.empty(out_channels, in_channels, *self.kernel_size))
        self.bias = Parameter(torch.empty(out_channels)) if bias else None

    def forward(self, x):
        n, _, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        return x._new((n, self.out_channels, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1))


class BatchNorm2d(Module):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, **_):
        Module.__init__(self)
        if affine:
            self.weight = Parameter(torch.empty(num_features))
            self.bias = Parameter(torch.empty(num_features))

    def forward(self, x):
        return x._new(x.shape)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, **_):
        Module.__init__(self)
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride if stride is not None else kernel_size)

    def forward(self, x):
        n, c, h, w = x.shape
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        return x._new((n, c, (h - kh) // sh + 1, (w - kw) // sw + 1))


class _Elementwise(Module):
    def __init__(self, *a, **k):
        Module.__init__(self)

    def forward(self, x):
        return x._new(x.shape)


class ReLU(_Elementwise):
    pass


class GELU(_Elementwise):
    pass


class Tanh(_Elementwise):
    pass


class Sigmoid(_Elementwise):
    pass


class SiLU(_Elementwise):
    pass


class Softmax(_Elementwise):
    pass


class LogSoftmax(_Elementwise):
    pass


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        Module.__init__(self)
        self.p = p

    def forward(self, x):
        return x


class Identity(Module):
    def forward(self, x):
        return x


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        Module.__init__(self)
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class Sequential(Module):
    def __init__(self, *modules):
        Module.__init__(self)
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            modules = list(modules[0].items())
        else:
            modules = [(str(i), m) for i, m in enumerate(modules)]
        for n, m in modules:
            self.add_module(n, m)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, m):
        self.add_module(str(len(self)), m)
        return self

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(Module):
    def __init__(self, modules=()):
        Module.__init__(self)
        for m in modules:
            self.append(m)

    def append(self, m):
        self.add_module(str(len(self._modules)), m)
        return self

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)


class CrossEntropyLoss(Module):
    def __init__(self, *a, **k):
        Module.__init__(self)

    def __call__(self, output, target):
        return functional.cross_entropy(output, target)


NLLLoss = CrossEntropyLoss


class MSELoss(Module):
    def __init__(self, *a, **k):
        Module.__init__(self)

    def __call__(self, output, target):
        return functional.mse_loss(output, target)


__all__ = ["Module", "Linear", "ReLU", "Sequential", "Parameter", "ModelOutput"]

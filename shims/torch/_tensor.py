"""torch.Tensor as shapes, types and devices: a tensor on the GPU owns a
`Storage`, whose death (CPython's) frees its block in the engine. Views
share their base's storage, as PyTorch's do."""

import builtins as _b
from functools import reduce

import vramlab_shim as vs


class dtype:
    def __init__(self, name, itemsize, floating):
        self.name, self.itemsize, self.is_floating_point = name, itemsize, floating

    def __repr__(self):
        return "torch." + self.name


float64 = double = dtype("float64", 8, True)
float32 = float = dtype("float32", 4, True)
float16 = half = dtype("float16", 2, True)
bfloat16 = dtype("bfloat16", 2, True)
int64 = long = dtype("int64", 8, False)
int32 = int = dtype("int32", 4, False)
int16 = short = dtype("int16", 2, False)
int8 = dtype("int8", 1, False)
uint8 = dtype("uint8", 1, False)
bool = dtype("bool", 1, False)


class device:
    def __init__(self, type, index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        type = str(type)
        if ":" in type:
            type, i = type.split(":")
            index = _b.int(i)
        if type not in ("cuda", "cpu", "meta"):
            raise RuntimeError("Expected one of cpu, cuda, meta device type at start of device string: " + type)
        self.type, self.index = type, index

    def __repr__(self):
        return "device(type='%s'%s)" % (self.type, "" if self.index is None else ", index=%d" % self.index)

    def __str__(self):
        return self.type if self.index is None else "%s:%d" % (self.type, self.index)

    def __eq__(self, other):
        return str(self) == str(device(other)) if other is not None else False

    def __hash__(self):
        return hash(str(self))


def on_gpu(d):
    return d is not None and device(d).type == "cuda"


class Size(tuple):
    def numel(self):
        return reduce(lambda a, b: a * b, self, 1)

    def __repr__(self):
        return "torch.Size([%s])" % ", ".join(str(d) for d in self)


class Storage(vs.Owner):
    """A block of device memory, named in the engine."""

    def __init__(self, shape, dt, category=None, name=None):
        self.nbytes = Size(shape).numel() * dt.itemsize
        self._name = None
        name = name or vs.fresh_name()
        cmd = vs.command("alloc", name=name, shape=list(shape), dtype=dt.name)
        if category:
            cmd["category"] = category
        vs.make(cmd)
        self._name = name


class Tensor:
    __array_priority__ = 1000

    def __init__(self, shape, dt=None, dev="cpu", storage=None, requires_grad=False, keep=(), value=None, category=None):
        self._shape = Size(_b.int(d) for d in shape)
        self.dtype = dt or float32
        self.device = device(dev)
        self.requires_grad = requires_grad
        self.grad = None
        self._keep = list(keep)
        self._value = value
        if storage is None and self.device.type == "cuda":
            storage = Storage(self._shape, self.dtype, category)
        self._storage = storage

    # ----- what it is
    @property
    def shape(self):
        return self._shape

    def size(self, dim=None):
        return self._shape if dim is None else self._shape[dim]

    def dim(self):
        return len(self._shape)

    ndim = property(dim)

    def numel(self):
        return self._shape.numel()

    def element_size(self):
        return self.dtype.itemsize

    def nbytes_(self):
        return self.numel() * self.dtype.itemsize

    nbytes = property(nbytes_)

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __repr__(self):
        dev = ", device='cuda:0'" if self.is_cuda else ""
        return "tensor(<%s>%s, dtype=%r)" % ("x".join(map(str, self._shape)) or "scalar", dev, self.dtype)

    def item(self):
        return self._value if self._value is not None else 0.0

    def __float__(self):
        return _b.float(self.item())

    def __bool__(self):
        return _b.bool(self.item())

    def tolist(self):
        return [0.0] * self.numel()

    def data_ptr(self):
        return id(self._storage) if self._storage is not None else 0

    # ----- moving and casting: a new block where the device or type changes
    def to(self, *args, **kwargs):
        dev, dt = self.device, self.dtype
        for a in list(args) + [kwargs.get("device"), kwargs.get("dtype")]:
            if a is None:
                continue
            if isinstance(a, dtype):
                dt = a
            elif isinstance(a, Tensor):
                dev, dt = a.device, a.dtype
            else:
                dev = device(a)
        if device(dev).type == "cuda" and device(dev).index is None:
            dev = device("cuda", 0)
        if str(dev) == str(self.device) and dt is self.dtype:
            return self
        return Tensor(self._shape, dt, dev, requires_grad=self.requires_grad, keep=self._keep)

    def cuda(self, device=None, non_blocking=False):
        return self.to("cuda" if device is None else device)

    def cpu(self):
        return self.to("cpu")

    def float(self):
        return self.to(float32)

    def half(self):
        return self.to(float16)

    def bfloat16(self):
        return self.to(bfloat16)

    def long(self):
        return self.to(int64)

    def int(self):
        return self.to(int32)

    def type(self, dt=None):
        return self.to(dt) if dt is not None else "torch." + ("cuda." if self.is_cuda else "") + "FloatTensor"

    def numpy(self):
        if self.is_cuda:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")
        import numpy

        return numpy.ndarray(self._shape, self.dtype.name)

    # ----- views: the same storage
    def _view(self, shape, grad=None):
        t = Tensor(shape, self.dtype, self.device, storage=self._storage, keep=self._keep, value=self._value)
        t.requires_grad = self.requires_grad if grad is None else grad
        return t

    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], dtype):
            return self._view(self._shape)
        return self._view(_reshaped(self._shape, shape))

    reshape = view

    def flatten(self, start_dim=0, end_dim=-1):
        s = list(self._shape)
        if not s:
            return self._view((1,))
        end = end_dim % len(s)
        merged = reduce(lambda a, b: a * b, s[start_dim : end + 1], 1)
        return self._view(s[:start_dim] + [merged] + s[end + 1 :])

    def detach(self):
        return self._view(self._shape, grad=False)

    def unsqueeze(self, d):
        s = list(self._shape)
        s.insert(d % (len(s) + 1), 1)
        return self._view(s)

    def squeeze(self, d=None):
        s = [x for i, x in enumerate(self._shape) if not (x == 1 and (d is None or i == d % len(self._shape)))]
        return self._view(s)

    def t(self):
        return self._view(tuple(reversed(self._shape)))

    T = property(t)

    def transpose(self, a, b):
        s = list(self._shape)
        s[a], s[b] = s[b], s[a]
        return self._view(s)

    def permute(self, *dims):
        dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else dims
        return self._view([self._shape[d] for d in dims])

    def expand(self, *shape):
        return self._view([o if n == -1 else n for o, n in zip(self._shape, _dims(shape))])

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        shape, dim = [], 0
        for i in index:
            if i is None:
                shape.append(1)
                continue
            if i is Ellipsis:
                rest = len(self._shape) - dim - sum(1 for j in index if j is not None and j is not Ellipsis) + (1 if Ellipsis in index else 0) - 1
                shape.extend(self._shape[dim : dim + rest])
                dim += rest
                continue
            if isinstance(i, slice):
                shape.append(len(range(*i.indices(self._shape[dim]))))
            elif isinstance(i, Tensor):
                return self._new(list(i.shape) + list(self._shape[dim + 1 :]))
            dim += 1
        return self._view(shape + list(self._shape[dim:]))

    def __setitem__(self, index, value):
        pass

    # ----- new results: a new block on the GPU
    def _new(self, shape, dt=None, keep=None, value=None):
        keep = self._keep if keep is None else keep
        return Tensor(shape, dt or self.dtype, self.device, requires_grad=self.requires_grad, keep=keep, value=value)

    def clone(self):
        return self._new(self._shape)

    def contiguous(self):
        return self

    def _binary(self, other, inplace=False):
        if inplace:
            return self
        if isinstance(other, Tensor):
            shape = broadcast_shapes(self._shape, other._shape)
            dt = self.dtype if self.dtype.is_floating_point or not other.dtype.is_floating_point else other.dtype
            keep = self._keep + other._keep + [t for t in (self, other) if t._routes_backward()]
            out = Tensor(shape, dt, self.device if self.is_cuda else other.device, requires_grad=self.requires_grad or other.requires_grad, keep=keep)
            return out
        return self._new(self._shape, keep=self._keep + ([self] if self._routes_backward() else []))

    def _routes_backward(self):
        """Whether a result must keep this tensor as its way to backward:
        not once backward has freed its graph (`total_loss += loss` after
        `loss.backward()` keeps no loss alive: PyTorch's AddBackward0 holds
        a node, not the tensor)."""
        return self.requires_grad and self._keep is not None and not self._graph_freed

    _graph_freed = False

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _binary
    __truediv__ = __rtruediv__ = __pow__ = __floordiv__ = _binary

    def add(self, other, alpha=1):
        return self._binary(other)

    sub = mul = div = add

    def __iadd__(self, other):
        return self._binary(other, inplace=True)

    __isub__ = __imul__ = __itruediv__ = __iadd__

    def add_(self, *a, **k):
        return self

    sub_ = mul_ = div_ = zero_ = fill_ = normal_ = uniform_ = copy_ = clamp_ = add_

    def __neg__(self):
        return self._new(self._shape)

    def _compare(self, other):
        shape = broadcast_shapes(self._shape, other._shape) if isinstance(other, Tensor) else self._shape
        return Tensor(shape, bool, self.device)

    __lt__ = __le__ = __gt__ = __ge__ = _compare

    def __eq__(self, other):
        return self._compare(other)

    def __ne__(self, other):
        return self._compare(other)

    __hash__ = object.__hash__

    def __matmul__(self, other):
        return self._new(matmul_shape(self._shape, other._shape), keep=self._keep + other._keep)

    matmul = mm = __matmul__

    def _reduce(self, dim=None, keepdim=False, **_):
        if dim is None:
            shape = ()
        else:
            dims = [d % len(self._shape) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
            shape = [1 if i in dims else s for i, s in enumerate(self._shape) if keepdim or i not in dims]
        return self._new(shape, keep=self._keep + ([self] if self.requires_grad else []), value=self._value)

    sum = mean = std = var = norm = amax = amin = _reduce

    def max(self, dim=None, keepdim=False):
        if dim is None:
            return self._reduce()
        return (self._reduce(dim, keepdim), self._reduce(dim, keepdim).long())

    min = max

    def argmax(self, dim=None, keepdim=False):
        return self._reduce(dim, keepdim).long()

    argmin = argmax

    def _unary(self, *a, **k):
        return self._new(self._shape)

    exp = log = sqrt = abs = relu = sigmoid = tanh = softmax = log_softmax = clamp = _unary

    def backward(self, gradient=None, retain_graph=None, create_graph=False):
        for t in self._keep:
            if hasattr(t, "backward") and isinstance(t, Tensor) and t.requires_grad:
                t.backward(retain_graph=retain_graph)
                if not retain_graph:
                    self._graph_freed = True
                    # The graph is freed: what only it held goes (the
                    # criterion's loss under `loss = criterion(...) / 4`).
                    self._keep = [k for k in self._keep if k is not t]
                return None
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")

    def requires_grad_(self, flag=True):
        self.requires_grad = flag
        return self


def _dims(shape):
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, Size)):
        return tuple(shape[0])
    return tuple(shape)


def _reshaped(old, shape):
    n = Size(old).numel()
    new = vs.reshaped(_dims(shape), n)
    if new is None:
        raise RuntimeError("shape '%s' is invalid for input of size %d" % (list(_dims(shape)), n))
    return new


def broadcast_shapes(a, b):
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + tuple(a)), reversed((1,) * (len(a) - len(b)) + tuple(b))):
        if x != y and 1 not in (x, y):
            raise RuntimeError(
                "The size of tensor a (%d) must match the size of tensor b (%d) at non-singleton dimension" % (x, y)
            )
        out.append(max(x, y))
    return tuple(reversed(out))


def matmul_shape(a, b):
    if len(a) == 1 and len(b) == 1:
        return ()
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise RuntimeError(
            "mat1 and mat2 shapes cannot be multiplied (%dx%d and %dx%d)" % (a2[-2], a2[-1], b2[-2], b2[-1])
        )
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = list(batch) + [a2[-2], b2[-1]]
    if len(a) == 1:
        out.pop(-2)
    if len(b) == 1:
        out.pop()
    return tuple(out)

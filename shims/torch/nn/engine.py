"""A module on the GPU as the engine's model: the engine allocates its
parameters in PyTorch's order, and a loss computed from its output runs
the engine's step program (forward up to the loss, backward, opt.step())."""

import torch
import vramlab_shim as _vs
from torch._amp import state as _amp
from torch._tensor import Tensor

_SKIP = ("Dropout", "Identity", "Flatten", "Sequential", "ModuleList")


def mlp_shape(module):
    """(layers, width, input_dim, classes) when the module is an MLP the
    engine runs: Linear layers with ReLU between, equal hidden widths;
    else the reason it is not."""
    linears, kinds = [], []
    for m in list(module.modules())[1:] if module._modules else [module]:
        name = type(m).__name__
        if name == "Linear":
            linears.append(m)
            kinds.append("Linear")
        elif name == "ReLU":
            kinds.append("ReLU")
        elif name in _SKIP or m._modules:
            continue
        else:
            return "a %s layer" % name
    if not linears:
        return "no Linear layer"
    for a, b in zip(linears, linears[1:]):
        if a.out_features != b.in_features:
            return "Linear(%d, %d) followed by Linear(%d, %d)" % (a.in_features, a.out_features, b.in_features, b.out_features)
    widths = {m.out_features for m in linears[:-1]}
    if len(widths) > 1:
        return "hidden layers of different widths (%s)" % ", ".join(str(m.out_features) for m in linears[:-1])
    if any(m.bias is None for m in linears):
        return "a Linear layer without bias"
    width = linears[0].out_features if len(linears) > 1 else linears[0].out_features
    return (len(linears) - 1, width, linears[0].in_features, linears[-1].out_features)


class EngineModel(_vs.Owner):
    def __init__(self, name, shape, dtype, kind=None):
        self._name = name
        self.layers, self.width, self.input_dim, self.classes = shape
        self.dtype = dtype
        self.data = None
        self.optimizers = []
        # A sample's input and target shapes, and the input's type; the
        # logits a sample gives.
        self.kind = kind or {"kind": "mlp"}
        self.x_shape = tuple(self.kind.get("x_shape", (self.input_dim,)))
        self.x_dtype = self.kind.get("x_dtype", dtype)
        self.y_shape = tuple(self.kind.get("y_shape", ()))
        self.out_shape = tuple(self.kind.get("out_shape", (self.classes,)))

    @staticmethod
    def place_kind(module, cmd, shape, kind, dtype=None):
        """A CNN or a transformer (vramlab.models): the engine builds it
        from `cmd` (a `model` command's fields)."""
        name = _vs.fresh_name()
        cmd = dict(cmd, cmd="model", name=name)
        if dtype is not None and dtype is not torch.float32:
            cmd["dtype"] = dtype.name
        _vs.make(cmd)
        engine = EngineModel(name, shape, dtype or torch.float32, kind)
        for p in module.parameters():
            p.device = torch.device("cuda", 0)
            p.dtype = engine.dtype
            p._storage = engine
        return engine

    @staticmethod
    def place(module, dtype=None):
        if hasattr(module, "_engine_model"):
            return module._engine_model(dtype)
        shape = mlp_shape(module)
        if isinstance(shape, str):
            raise NotImplementedError(
                "vramlab's engine runs the training step of an MLP (Linear layers with ReLU between, "
                "equal hidden widths) as PyTorch runs it; this model has %s" % shape
            )
        if shape[0] == 0:
            raise NotImplementedError("vramlab's engine runs an MLP with at least one hidden layer; this model is one Linear layer")
        name = _vs.fresh_name()
        cmd = _vs.command("model", name=name, kind="mlp", layers=shape[0], width=shape[1], input_dim=shape[2], classes=shape[3])
        if dtype is not None and dtype is not torch.float32:
            cmd["dtype"] = dtype.name
        _vs.make(cmd)
        engine = EngineModel(name, shape, dtype or torch.float32)
        for p in module.parameters():
            p.device = torch.device("cuda", 0)
            p.dtype = engine.dtype
            p._storage = engine
        return engine

    def forward(self, x):
        if not x.is_cuda:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
            )
        if self.kind["kind"] != "mlp":
            if tuple(x.shape[1:]) != self.x_shape or x.dtype is not self.x_dtype:
                raise RuntimeError(
                    "the %s takes a batch of shape (batch, %s) and type %s, not %s of %s"
                    % (self.kind["kind"], ", ".join(map(str, self.x_shape)), self.x_dtype, tuple(x.shape), x.dtype)
                )
        elif x.shape[-1] != self.input_dim:
            raise RuntimeError(
                "mat1 and mat2 shapes cannot be multiplied (%dx%d and %dx%d)"
                % (x.numel() // x.shape[-1], x.shape[-1], self.input_dim, self.width)
            )
        out = ModelOutput(self, x)
        checkpointing = self.kind.get("checkpointing")
        if checkpointing is not None and checkpointing():
            out.checkpointing = True
        if not torch.is_grad_enabled():
            out._run_without_grad()
        return out

    def dataset(self, batch):
        if self.data is None or self.data[1] < batch:
            name = _vs.fresh_name("dataset")
            _vs.run(_vs.command("data", name=name, samples=batch, features=self.input_dim, classes=self.classes))
            self.data = (_Named(name), batch)
        return self.data[0]._name

    def loss(self, out, target, name):
        x = out.x
        batch = x.shape[0]
        whole = (batch,) + self.y_shape
        if tuple(target.shape) != whole and target.numel() != _count(whole):
            raise ValueError("Expected input batch_size (%d) to match target batch_size (%d)." % (batch, target.shape[0] if target.shape else 1))
        if not target.is_cuda:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")
        cmd = _vs.command("forward", name=name, model=self._name, data=self.dataset(batch), batch_size=batch, batch=[x._storage._name, target._storage._name])
        if _amp["dtype"] is not None:
            cmd["amp"] = _amp["dtype"].name
        if getattr(out, "checkpointing", False):
            cmd["checkpointing"] = True
        attention = self.kind.get("attention")
        if attention is not None and attention() != "eager":
            cmd["attention"] = attention()
        if not torch.is_grad_enabled():
            cmd["no_grad"] = True
        return _vs.run(cmd)

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none)
            return


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def loss_value(record):
    """The loss the engine computed; None where the step ran shape-only."""
    return (record.get("value") or {}).get("loss")


class _Named(_vs.Owner):
    def __init__(self, name):
        self._name = name


class Loss(Tensor):
    """The loss of the engine's forward: its name holds the autograd graph."""

    def __init__(self, name, record, keep):
        Tensor.__init__(self, (), torch.float32, "cuda", storage=_Named(name), requires_grad=torch.is_grad_enabled(), keep=keep)
        self._value = loss_value(record)

    def item(self):
        """The loss the engine computed; NaN, with a note, where it ran the
        step shape-only."""
        if self._value is None:
            _vs.note("the engine ran this step shape-only (its memory is exact, its loss not computed): .item() gives nan")
            return _vs.NotComputed("shape-only step: its memory is exact, its loss not computed")
        return self._value

    def backward(self, gradient=None, retain_graph=None, create_graph=False):
        if not self.requires_grad:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        _vs.run(_vs.command("backward", name=self._storage._name, retain_graph=bool(retain_graph)))
        if not retain_graph:
            self._graph_freed = True


class ModelOutput(Tensor):
    """`model(x)`: the logits, computed by the engine's forward when a loss
    is taken of them (the forward runs up to the loss in one program)."""

    def __init__(self, model, x):
        lead = tuple(x.shape[:-1]) if model.kind["kind"] == "mlp" else (x.shape[0],)
        Tensor.__init__(self, lead + model.out_shape, model.dtype, "cuda",
                        storage=_Pending(), requires_grad=torch.is_grad_enabled(), keep=[model])
        self.model, self.x = model, x

    def _run_without_grad(self):
        target = torch.zeros((self.x.shape[0],) + self.model.y_shape, dtype=torch.int64, device="cuda")
        name = _vs.fresh_name()
        try:
            record = self.model.loss(self, target, name)
        except BaseException:
            _vs._live.discard(name)
            raise
        self._storage = _Named(name)
        self._value = loss_value(record)

    def _view(self, shape, grad=None):
        """A view of the logits not yet computed (`logits.flatten(0, 1)`
        for a token-level loss): still the model's output."""
        if not isinstance(self._storage, _Pending):
            return Tensor._view(self, shape, grad)
        out = ModelOutput(self.model, self.x)
        out._shape = type(self._shape)(shape)
        out.checkpointing = getattr(self, "checkpointing", False)
        return out

    def _materialize(self):
        if isinstance(self._storage, _Pending):
            self._storage = torch._tensor.Storage(self.shape, self.dtype, "activation")
        return self

    def _new(self, *a, **k):
        self._materialize()
        return Tensor._new(self, *a, **k)


class _Pending:
    _name = None

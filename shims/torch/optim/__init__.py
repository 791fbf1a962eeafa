"""torch.optim: an optimizer over a model on the engine; its state (made by
the first step) lives as long as CPython keeps the optimizer."""

import vramlab_shim as _vs
from torch.optim import lr_scheduler  # noqa: F401


def _engine_of(params):
    from torch.nn.engine import EngineModel

    params = list(params)
    if params and isinstance(params[0], dict):
        params = [p for g in params for p in g["params"]]
    for p in params:
        if isinstance(p._storage, EngineModel) or getattr(p._storage, "is_hf_model", False):
            return p._storage, params
    raise NotImplementedError(
        "vramlab's optimizers update a model on the GPU: move the model with .to('cuda') before making the optimizer"
    )


class Optimizer(_vs.Owner):
    kind = "sgd"

    def __init__(self, params, lr=1e-3, momentum=0.0, **_):
        self._name = None
        model, self._params = _engine_of(params)
        kind = "momentum" if self.kind == "sgd" and momentum else self.kind
        name = _vs.fresh_name()
        _vs.make(_vs.command("optimizer", name=name, model=model._name, kind=kind, lr=lr))
        self._name = name
        self.model = model
        model.optimizers.append(self)
        self.param_groups = [{"params": self._params, "lr": lr}]
        self.state = {}

    def step(self, closure=None):
        _vs.run(_vs.command("step", optimizer=self._name))

    def zero_grad(self, set_to_none=True):
        _vs.run(_vs.command("zero_grad", optimizer=self._name, set_to_none=bool(set_to_none)))

    def __del__(self):
        model = getattr(self, "model", None)
        if model is not None and self in model.optimizers:
            model.optimizers.remove(self)
        _vs.Owner.__del__(self)


class SGD(Optimizer):
    kind = "sgd"


class Adam(Optimizer):
    kind = "adam"


class AdamW(Optimizer):
    kind = "adamw"

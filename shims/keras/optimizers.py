"""Keras optimizers: given to compile, or applying a GradientTape's
gradients; their state (made at the first step) lives with them."""

import vramlab_shim as _vs


class Optimizer(_vs.Owner):
    kind = "sgd"

    def __init__(self, learning_rate=None, momentum=0.0, **_):
        self._name = None
        self.model = None
        self.learning_rate = learning_rate
        self._hint = _vs.line_target()
        if self.kind == "sgd" and momentum:
            self.kind = "momentum"

    def apply_gradients(self, grads_and_vars, **_):
        pairs = list(grads_and_vars)
        model = getattr(pairs[0][1], "_model", None) if pairs else None
        if model is None or model._name is None:
            raise NotImplementedError("vramlab's Keras optimizers apply the gradients of a built model's variables")
        if self._name is None:
            name = _vs.fresh_name(self._hint or "optimizer")
            cmd = _vs.command("optimizer", name=name, model=model._name, kind=self.kind)
            if self.learning_rate is not None:
                cmd["lr"] = self.learning_rate
            _vs.make(cmd)
            self._name, self.model = name, model
            model._optimizers.add(self)
        _vs.run(_vs.command("step", optimizer=self._name))


class SGD(Optimizer):
    kind = "sgd"


class Adam(Optimizer):
    kind = "adam"


class AdamW(Optimizer):
    kind = "adamw"


def get(identifier):
    """An optimizer by its name, as `compile(optimizer="adam")` makes one."""
    kinds = {"adam": Adam, "adamw": AdamW, "sgd": SGD}
    return kinds.get(str(identifier).lower(), Adam)()

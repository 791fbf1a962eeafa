"""keras.Sequential on the engine: built (its variables made) when its
input shape is known, trained by fit as one `train` of the engine."""

import math
from functools import reduce

import vramlab_shim as _vs
from keras import layers as _layers


class Tensor(_vs.Owner):
    """A tf.Tensor on the GPU."""

    def __init__(self, shape, dtype="float32"):
        self._name = None
        self.shape = tuple(shape)
        self.dtype = dtype
        name = _vs.fresh_name()
        _vs.run({"cmd": "alloc", "name": name, "shape": list(self.shape), "dtype": str(dtype)})
        self._name = name


def Input(shape=None, **k):
    return _layers.InputLayer(shape=shape)


class Sequential(_vs.Owner):
    def __init__(self, layers=None, name=None):
        self._name = None
        self.layers = list(layers or [])
        self.optimizer = None
        self.data = None
        self.jit_compile = True
        self._build_if_known()

    def add(self, layer):
        self.layers.append(layer)
        self._build_if_known()

    def _shape(self):
        first = self.layers[0] if self.layers else None
        if first is None or first.input_shape is None:
            return None
        features = reduce(lambda a, b: a * b, first.input_shape, 1)
        dense = [l for l in self.layers if isinstance(l, _layers.Dense)]
        if len(dense) < 2:
            return None
        hidden = {l.units for l in dense[:-1]}
        if len(hidden) != 1:
            raise NotImplementedError(
                "vramlab's engine runs an MLP of equal hidden widths; this model's Dense layers are %s"
                % ", ".join(str(l.units) for l in dense)
            )
        return len(dense) - 1, dense[0].units, features, dense[-1].units

    def _build_if_known(self):
        if self._name is not None:
            return
        shape = self._shape()
        if shape is None:
            return
        name = _vs.fresh_name()
        try:
            _vs.run({"cmd": "model", "name": name, "kind": "mlp", "layers": shape[0], "width": shape[1],
                     "input_dim": shape[2], "classes": shape[3], "keras": True})
        except BaseException:
            _vs._live.discard(name)
            raise
        self._name = name
        self.features, self.classes = shape[2], shape[3]

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, jit_compile="auto", **_):
        kind, lr = _optimizer(optimizer)
        name = _vs.fresh_name(self._name + "_optimizer")
        cmd = {"cmd": "optimizer", "name": name, "model": self._name, "kind": kind}
        if lr is not None:
            cmd["lr"] = lr
        _vs.run(cmd)
        self.optimizer = name
        self.jit_compile = jit_compile is not False

    def fit(self, x, y=None, batch_size=32, epochs=1, steps_per_epoch=None, verbose="auto", **_):
        if self.optimizer is None:
            raise RuntimeError("You must call `compile()` before using the model.")
        samples = x.shape[0]
        if self.data is None:
            self.data = _vs.fresh_name(self._name + "_data")
            _vs.run({"cmd": "data", "name": self.data, "samples": samples, "features": self.features,
                     "classes": self.classes})
        steps = (steps_per_epoch or math.ceil(samples / batch_size)) * epochs
        _vs.run({"cmd": "train", "model": self._name, "optimizer": self.optimizer, "data": self.data,
                 "steps": steps, "batch_size": batch_size, "jit_compile": self.jit_compile})
        return None

    def __del__(self):
        # The model owns its optimizer (model.optimizer) and the data it was fit on.
        for name in (self.optimizer, self.data):
            if name:
                _vs.release(name)
        _vs.Owner.__del__(self)

    def summary(self):
        print('Model: "sequential"')

    def count_params(self):
        layers, width, features, classes = self._shape()
        return (features + 1) * width + (layers - 1) * (width + 1) * width + (width + 1) * classes


def _optimizer(o):
    if isinstance(o, str):
        return {"adam": "adam", "adamw": "adamw", "sgd": "sgd"}.get(o.lower(), "adam"), None
    return o.kind, o.learning_rate

"""Keras models on the engine: a Sequential, a functional Model or a
subclass with its own `call`, built (its variables made) when its input
shape is known, as Keras builds it; `fit` runs as one `train` of the
engine, and `model(x)` under a GradientTape as the engine's forward."""

import math
import re
import weakref
from functools import reduce

import vramlab_shim as _vs
from keras import layers as _layers
from keras import losses as _losses
from keras import optimizers as _optimizers
from keras.tensor import HostTensor, Symbol, Tensor  # noqa: F401 (keras.model's names too)


def _product(shape):
    return reduce(lambda a, b: a * b, shape, 1)


def Input(shape=None, batch_size=None, **k):
    return Symbol((batch_size,) + tuple(shape or ()))


class Variable:
    """A model's variable (its bytes are the engine model's)."""

    def __init__(self, name, shape, dtype="float32"):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype

    def __repr__(self):
        return "<Variable path=%s, shape=%s, dtype=%s>" % (self.name, self.shape, self.dtype)


def _snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Model(_vs.Owner):
    """tf.keras.Model: functional (`Model(inputs, outputs)`) or a subclass
    that defines `call`."""

    def __init__(self, inputs=None, outputs=None, name=None, **_):
        self._name = None
        self.optimizer = None
        self.data = None
        self.jit_compile = True
        self._traced = outputs.dense if isinstance(outputs, Symbol) else None
        self._input = inputs.shape if isinstance(inputs, Symbol) else None
        self._gradients = None
        self._optimizers = weakref.WeakSet()
        if self._traced is not None:
            self._build(self._input)

    def call(self, x, training=None):
        raise NotImplementedError("Model.call: subclasses of tf.keras.Model define call(self, inputs)")

    # ----- the shape, learned by tracing `call` ---------------------------

    def _trace(self, input_shape):
        if self._traced is None:
            out = self.call(Symbol((None,) + tuple(input_shape[1:])))
            if not isinstance(out, Symbol):
                raise NotImplementedError("vramlab's Keras traces call() through its layers; this call() returned %r" % (out,))
            self._traced = out.dense
            self._input = (None,) + tuple(input_shape[1:])
        return self._traced

    def _shape(self, input_shape=None):
        shape = self._input if input_shape is None else input_shape
        if shape is None or any(d is None for d in shape[1:]):
            return None
        dense = self._trace(shape)
        if len(dense) < 2:
            raise NotImplementedError(
                "vramlab's engine runs an MLP of Dense layers (at least two); this model has %d" % len(dense)
            )
        hidden = {l.units for l in dense[:-1]}
        if len(hidden) != 1:
            raise NotImplementedError(
                "vramlab's engine runs an MLP of equal hidden widths; this model's Dense layers are %s"
                % ", ".join(str(l.units) for l in dense)
            )
        return len(dense) - 1, dense[0].units, _product(shape[1:]), dense[-1].units

    def _build_if_known(self):
        return self._name is not None

    def _build(self, input_shape=None, hint=None):
        """Makes the model's variables (once), as Keras builds a model."""
        if self._name is not None:
            return True
        shape = self._shape(input_shape)
        if shape is None:
            return False
        name = _vs.fresh_name(hint)
        _vs.make(_vs.command("model", name=name, kind="mlp", layers=shape[0], width=shape[1], input_dim=shape[2], classes=shape[3], keras=True))
        self._name = name
        self.features, self.classes = shape[2], shape[3]
        return True

    def build(self, input_shape):
        self._build(tuple(input_shape), _snake(type(self).__name__))

    @property
    def built(self):
        return self._name is not None

    # ----- running it -----------------------------------------------------

    def __call__(self, x, training=None, **_):
        if isinstance(x, Symbol):
            return self.call(x)
        self._build(x.shape, _snake(type(self).__name__))
        return _losses.Output(self, x)

    def engine_optimizer(self):
        """An optimizer of this model in the engine (compile's, or one that
        applied gradients), or None."""
        for o in self._optimizers:
            if o._name is not None:
                return o._name
        return None

    @property
    def trainable_variables(self):
        if self._name is None and not self._build_if_known():
            return []
        out, features = [], self.features
        for i, layer in enumerate(self._traced):
            prefix = "dense" if i == 0 else "dense_%d" % i
            out += [Variable(prefix + "/kernel", (features, layer.units)), Variable(prefix + "/bias", (layer.units,))]
            features = layer.units
        for v in out:
            v._model = self
        return out

    trainable_weights = weights = variables = trainable_variables

    def count_params(self):
        return sum(_product(v.shape) for v in self.trainable_variables)

    def summary(self):
        print('Model: "%s"' % _snake(type(self).__name__))
        print(" Total params: %d" % self.count_params())

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, jit_compile="auto", **_):
        if self._name is None and not self._build_if_known():
            raise ValueError("vramlab builds a Keras model when its input shape is known: give the first layer "
                             "input_shape=, or call the model on a batch, before compile()")
        if isinstance(optimizer, str):
            optimizer = _optimizers.get(optimizer)
            optimizer._hint = self._name + "_optimizer"
        if optimizer._name is None:
            name = _vs.fresh_name(optimizer._hint or self._name + "_optimizer")
            cmd = _vs.command("optimizer", name=name, model=self._name, kind=optimizer.kind)
            if optimizer.learning_rate is not None:
                cmd["lr"] = optimizer.learning_rate
            _vs.run(cmd)
            optimizer._name = name
            self._optimizers.add(optimizer)
        # Keras's model.optimizer is that object (an optimizer that already
        # applied gradients keeps its state): its state, made once, serves
        # fit and apply_gradients alike, and lives as long as the object.
        self.optimizer = optimizer
        self.jit_compile = jit_compile is not False

    def fit(self, x, y=None, batch_size=None, epochs=1, steps_per_epoch=None, verbose="auto", **_):
        if self.optimizer is None:
            raise RuntimeError("You must call `compile()` before using the model.")
        samples = x.shape[0]
        if getattr(x, "batch_size", None):
            batch_size = x.batch_size
        batch_size = batch_size or 32
        if self.data is None:
            self.data = _vs.fresh_name(self._name + "_data")
            _vs.run(_vs.command("data", name=self.data, samples=samples, features=self.features, classes=self.classes))
        steps = (steps_per_epoch or math.ceil(samples / batch_size)) * epochs
        _vs.run(_vs.command("train", model=self._name, optimizer=self.optimizer._name, data=self.data, steps=steps, batch_size=batch_size, jit_compile=self.jit_compile))
        return None

    def dataset(self, batch):
        """The engine's data object for a step of `batch` (host memory)."""
        if self.data is None:
            self.data = _vs.fresh_name(self._name + "_data")
            _vs.run(_vs.command("data", name=self.data, samples=batch, features=self.features, classes=self.classes))
        return self.data

    def __del__(self):
        # The model owns the data it was fit on (its optimizer is an object
        # of its own, freed with its last reference).
        if self.data:
            _vs.release(self.data)
        _vs.Owner.__del__(self)


class Sequential(Model):
    def __init__(self, layers=None, name=None):
        Model.__init__(self)
        self.layers = []
        for layer in layers or []:
            self._append(layer)
        self._build_if_known()

    def add(self, layer):
        """Keras builds each added layer at once when the input shape is
        known; the engine's model is built whole, at its first use."""
        self._append(layer)

    def _append(self, layer):
        if self._name is not None:
            raise NotImplementedError("vramlab builds a Sequential model whole: add every layer before using it")
        if isinstance(layer, Symbol):  # keras.Input(shape=...) as the first layer
            layer = _layers.InputLayer(shape=layer.shape[1:])
        self.layers.append(layer)

    def call(self, x, training=None):
        for layer in self.layers:
            x = layer(x)
        return x

    def _build_if_known(self):
        first = self.layers[0] if self.layers else None
        if first is None or first.input_shape is None:
            return False
        return self._build((None,) + tuple(first.input_shape))


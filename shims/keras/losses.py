"""Keras's losses of a model's output: the engine's forward of the model
on the batch, with the tape's saved tensors when a GradientTape records."""

import vramlab_shim as _vs
from keras.recording import recording
from keras.tensor import Tensor


class Output:
    """`model(x)`: the logits, computed by the engine's forward when a loss
    is taken of them; at once when no tape records (inference)."""

    def __init__(self, model, x):
        self.model, self.x = model, x
        self.shape = (x.shape[0], model.classes)
        self.dtype = "float32"
        self.loss = None
        if not recording():
            self.loss = Loss(model, x, None, grad=False)


def _on_gpu(t, shape, dtype):
    """`t` as the op reads it: the tensor itself when it is on the GPU with
    that shape and type, else its copy (cast, flattened) there."""
    if isinstance(t, Tensor) and t.dtype == dtype and t.shape == tuple(shape):
        return t
    return Tensor(shape, dtype, hint="input" if dtype == "float32" else "labels")


class Loss(_vs.Owner):
    """The loss of the engine's forward: its name holds the tape's saved
    tensors until the gradient is taken."""

    def __init__(self, model, x, y, grad=True):
        self._name = None
        self.model = model
        self.shape, self.dtype = (), "float32"
        batch = x.shape[0]
        if y is not None and tuple(y.shape[:1]) != (batch,):
            raise ValueError("Arguments `target` and `output` must have the same shape up until the last "
                             "dimension: target.shape=%s, output.shape=%s" % (tuple(y.shape), (batch, model.classes)))
        self._inputs = [_on_gpu(x, (batch, model.features), "float32")]
        self._inputs.append(_on_gpu(y, (batch,), "int64") if y is not None else _on_gpu(None, (batch,), "int64"))
        name = _vs.fresh_name()
        cmd = _vs.command("forward", name=name, model=model._name, data=model.dataset(batch), batch_size=batch, batch=[t._name for t in self._inputs])
        if not grad:
            cmd["no_grad"] = True
        record = _vs.make(cmd)
        self._name = name
        self._value = (record.get("value") or {}).get("loss")
        if not grad:
            self.release_inputs()

    def release_inputs(self):
        self._inputs = []

    def numpy(self):
        return float(self)

    def __float__(self):
        if self._value is None:
            _vs.note("the engine ran this step shape-only (its memory is exact, its loss not computed): the loss is nan")
            return _vs.NotComputed("shape-only step: its memory is exact, its loss not computed")
        return float(self._value)

    def __format__(self, spec):
        return format(float(self), spec)

    def __repr__(self):
        return "<tf.Tensor: shape=(), dtype=float32, numpy=%s>" % float(self)


def sparse_categorical_crossentropy(y_true, y_pred, from_logits=False, **_):
    if not isinstance(y_pred, Output):
        raise NotImplementedError("vramlab's Keras takes a loss of a model's output")
    if y_pred.loss is not None:
        return y_pred.loss
    return Loss(y_pred.model, y_pred.x, y_true)


class SparseCategoricalCrossentropy:
    def __init__(self, from_logits=False, **_):
        self.from_logits = from_logits

    def __call__(self, y_true, y_pred, sample_weight=None):
        return sparse_categorical_crossentropy(y_true, y_pred, self.from_logits)

"""A tf.Tensor: on the GPU (an engine tensor, its memory exact, its values
computed only where the engine computes them) or in host memory; and a
symbolic batch (Keras's KerasTensor)."""

import vramlab_shim as _vs


class Tensor(_vs.Owner):
    """A tf.Tensor on the GPU."""

    device = "/job:localhost/replica:0/task:0/device:GPU:0"

    def __init__(self, shape, dtype="float32", value=None, category=None, hint=None):
        self._name = None
        self.shape = tuple(shape)
        self.dtype = str(dtype)
        self._value = value
        name = _vs.fresh_name(hint)
        cmd = _vs.command("alloc", name=name, shape=list(self.shape), dtype=self.dtype)
        if category:
            cmd["category"] = category
        _vs.make(cmd)
        self._name = name

    def numpy(self):
        if self._value is not None:
            return self._value
        import numpy as np

        return np.zeros(self.shape, self.dtype)

    def __float__(self):
        if self._value is None:
            _vs.note("this tensor's values are not computed here (its memory is exact): float() gives nan")
            return _vs.NotComputed("values not computed here: its memory is exact")
        return float(self._value)

    def __format__(self, spec):
        return format(float(self), spec) if self.shape == () else repr(self)

    def __repr__(self):
        return "<tf.Tensor: shape=%s, dtype=%s>" % (self.shape, self.dtype)


class HostTensor:
    """A tf.Tensor in host memory (what tf.data yields): no GPU memory
    until an op on the GPU reads it."""

    device = "/job:localhost/replica:0/task:0/device:CPU:0"

    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), str(dtype)

    def __repr__(self):
        return "<tf.Tensor: shape=%s, dtype=%s>" % (self.shape, self.dtype)


class Symbol:
    """A symbolic batch (Keras's KerasTensor): the shape a layer sees and
    the Dense layers it went through, to learn a model's shape without
    running it."""

    def __init__(self, shape, dense=(), source=None):
        self.shape = tuple(shape)
        self.dense = tuple(dense)
        self.source = source or self

    def through(self, shape, layer=None):
        return Symbol(shape, self.dense + ((layer,) if layer is not None else ()), self.source)

"""Keras metrics: each holds its state as variables on the GPU (a total
and a count), as Keras's do."""

from keras.tensor import Tensor


class Mean:
    def __init__(self, name="mean", dtype="float32"):
        self.name = name
        self.total = Tensor((), dtype, hint=name + "_total")
        self.count = Tensor((), dtype, hint=name + "_count")
        self._sum, self._n = 0.0, 0

    def update_state(self, value, sample_weight=None):
        self._sum += float(value)
        self._n += 1

    __call__ = update_state

    def result(self):
        return self._sum / self._n if self._n else 0.0

    def reset_state(self):
        self._sum, self._n = 0.0, 0

    reset_states = reset_state

"""tf.data: datasets of host arrays, batched; their batches are on the
host (tf.data runs on the CPU) until a GPU op reads them."""

import math

from keras.tensor import HostTensor


class Dataset:
    def __init__(self, arrays, batch_size=None, limit=None, drop_remainder=False):
        self.arrays = arrays
        self.batch_size = batch_size
        self.limit = limit
        self.drop_remainder = drop_remainder

    @staticmethod
    def from_tensor_slices(tensors):
        arrays = tuple(tensors) if isinstance(tensors, (tuple, list)) else (tensors,)
        return Dataset(arrays)

    def _with(self, **k):
        d = Dataset(self.arrays, self.batch_size, self.limit, self.drop_remainder)
        d.__dict__.update(k)
        return d

    def batch(self, batch_size, drop_remainder=False, **_):
        return self._with(batch_size=batch_size, drop_remainder=drop_remainder)

    def take(self, count):
        return self._with(limit=count)

    def shuffle(self, buffer_size, **_):
        return self

    def prefetch(self, buffer_size=None, **_):
        return self

    def cache(self, *a, **k):
        return self

    def repeat(self, count=None):
        return self

    @property
    def shape(self):
        return self.arrays[0].shape

    def _sizes(self):
        samples = self.arrays[0].shape[0]
        if self.batch_size is None:
            sizes = [None] * samples
        else:
            full, rest = divmod(samples, self.batch_size)
            sizes = [self.batch_size] * full + ([rest] if rest and not self.drop_remainder else [])
        return sizes[: self.limit] if self.limit is not None else sizes

    def __len__(self):
        return len(self._sizes())

    def cardinality(self):
        return len(self)

    def __iter__(self):
        for size in self._sizes():
            rows = () if size is None else (size,)
            batch = tuple(HostTensor(rows + tuple(a.shape[1:]), a.dtype) for a in self.arrays)
            yield batch if len(batch) > 1 else batch[0]


AUTOTUNE = -1
experimental = type("experimental", (), {"AUTOTUNE": AUTOTUNE})
_ = math

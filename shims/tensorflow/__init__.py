"""vramlab's tensorflow: Keras models on the engine (TensorFlow's BFC
allocator), clear_session, TF1 sessions, and the memory numbers."""

import keras
import vramlab_shim as _vs
from tensorflow import compat, config, errors  # noqa: F401

__version__ = "2.21.0+vramlab"
_vs.FRAMEWORK = "tensorflow"


def zeros(shape, dtype="float32"):
    return keras.Tensor(shape, dtype)


ones = zeros


class random:
    @staticmethod
    def normal(shape, dtype="float32", **_):
        return keras.Tensor(shape, dtype)

    uniform = normal


float32, float16, int64, int32 = "float32", "float16", "int64", "int32"

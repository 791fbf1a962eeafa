"""vramlab's tensorflow: Keras models on the engine (TensorFlow's BFC
allocator), GradientTape, tf.data, tf.function, clear_session, TF1
sessions, and the memory numbers."""

import functools
import sys

import keras
import vramlab_shim as _vs
from tensorflow import compat, config, data, errors  # noqa: F401
from tensorflow.tape import GradientTape  # noqa: F401

# `tf.keras` is Keras, as `from tensorflow.keras.layers import Dense` reads it.
sys.modules["tensorflow.keras"] = keras
for _sub in ("backend", "datasets", "layers", "losses", "metrics", "optimizers"):
    sys.modules["tensorflow.keras." + _sub] = getattr(keras, _sub)

__version__ = "2.21.0+vramlab"
_vs.FRAMEWORK = "tensorflow"

newaxis = None
float64, float32, float16, bfloat16 = "float64", "float32", "float16", "bfloat16"
int64, int32, uint8, bool = "int64", "int32", "uint8", "bool"


def zeros(shape, dtype="float32"):
    return keras.Tensor(shape, dtype)


ones = zeros


class random:
    @staticmethod
    def normal(shape, dtype="float32", **_):
        return keras.Tensor(shape, dtype)

    uniform = normal


def function(func=None, jit_compile=None, **_):
    """tf.function: here the function runs op by op, as under
    tf.config.run_functions_eagerly(True)."""

    def wrap(f):
        @functools.wraps(f)
        def run(*a, **k):
            _vs.note("tf.function runs op by op here (as with tf.config.run_functions_eagerly(True)): "
                     "a traced graph's memory may differ")
            return f(*a, **k)

        return run

    return wrap(func) if func is not None else wrap


def _same(x, *a, **k):
    return x


class nn:
    relu = softmax = gelu = sigmoid = tanh = staticmethod(_same)


def reduce_mean(x, *a, **k):
    return x


def cast(x, dtype):
    if isinstance(x, keras.Tensor) and x.dtype != dtype:
        return keras.Tensor(x.shape, dtype)
    return x

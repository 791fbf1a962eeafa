"""vramlab's keras: Sequential, functional and subclassed models of Dense
layers as the engine's model (Keras's variables, TensorFlow's BFC
allocator), compile and fit on arrays or datasets, custom training loops,
clear_session."""

from keras import backend, datasets, layers, losses, metrics, optimizers  # noqa: F401
from keras.model import Input, Model, Sequential, Tensor  # noqa: F401

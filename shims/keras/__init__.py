"""vramlab's keras: Sequential models of Dense layers as the engine's model
(Keras's variables, TensorFlow's BFC allocator), compile, fit on arrays,
clear_session."""

from keras import backend, datasets, layers, optimizers  # noqa: F401
from keras.model import Input, Sequential, Tensor  # noqa: F401

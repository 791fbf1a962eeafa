"""Keras layers as shapes: what the engine's model is built from. Called on
a symbolic batch (Keras's KerasTensor) a layer says the shape it makes."""

from keras.tensor import Symbol


def _symbolic(x, layer):
    if not isinstance(x, Symbol):
        raise NotImplementedError(
            "vramlab's Keras runs layers inside a model (Sequential, functional or a subclass's call); "
            "%s was called on its own" % type(layer).__name__
        )
    return x


class Layer:
    def __init__(self, *a, input_shape=None, name=None, **k):
        self.input_shape = input_shape
        self.name = name

    def __call__(self, x, *a, **k):
        return _symbolic(x, self)


class Dense(Layer):
    def __init__(self, units, activation=None, input_shape=None, **k):
        Layer.__init__(self, input_shape=input_shape)
        self.units, self.activation = units, activation

    def __call__(self, x, *a, **k):
        x = _symbolic(x, self)
        return x.through(x.shape[:-1] + (self.units,), self)


class Flatten(Layer):
    def __call__(self, x, *a, **k):
        x = _symbolic(x, self)
        n = 1
        for d in x.shape[1:]:
            n *= d if d is not None else 1
        return x.through((x.shape[0], n))


class Dropout(Layer):
    def __init__(self, rate=0.5, **k):
        Layer.__init__(self, **k)


class ReLU(Layer):
    pass


class Activation(Layer):
    def __init__(self, activation=None, **k):
        Layer.__init__(self, **k)


class InputLayer(Layer):
    def __init__(self, shape=None, input_shape=None, **k):
        Layer.__init__(self, input_shape=shape or input_shape)

"""Keras layers as shapes: what the engine's model is built from."""


class Layer:
    def __init__(self, *a, input_shape=None, **k):
        self.input_shape = input_shape


class Dense(Layer):
    def __init__(self, units, activation=None, input_shape=None, **k):
        Layer.__init__(self, input_shape=input_shape)
        self.units, self.activation = units, activation


class Flatten(Layer):
    pass


class Dropout(Layer):
    def __init__(self, rate=0.5, **k):
        Layer.__init__(self, **k)


class InputLayer(Layer):
    def __init__(self, shape=None, input_shape=None, **k):
        Layer.__init__(self, input_shape=shape or input_shape)

"""tf.GradientTape: while one records, a model's forward keeps what its
gradients need; `gradient` runs the backward pass, and the gradients it
returns live as long as CPython keeps them."""

import weakref

import vramlab_shim as _vs
from keras.losses import Loss
from keras.recording import open_tapes, recording  # noqa: F401 (tape.recording, as before)
from keras.tensor import Tensor


class GradientTape:
    def __init__(self, persistent=False, watch_accessed_variables=True):
        self.persistent = persistent
        self._used = False

    def __enter__(self):
        open_tapes.append(self)
        return self

    def __exit__(self, *exc):
        open_tapes.remove(self)
        return False

    def watch(self, tensor):
        pass

    def gradient(self, target, sources, output_gradients=None, **_):
        if self._used and not self.persistent:
            raise RuntimeError(
                "A non-persistent GradientTape can only be used to compute one set of gradients (or jacobians)"
            )
        if not isinstance(target, Loss) or target.model is None:
            raise NotImplementedError("vramlab's GradientTape takes the gradient of a Keras loss of a model's output")
        self._used = True
        model = target.model
        Gradients.detach(model)
        _vs.run(_vs.command("backward", name=target._name, retain_graph=bool(self.persistent)))
        target.release_inputs()
        return Gradients(model, sources)


class Gradient:
    """One variable's gradient (its bytes are the model's gradients)."""

    def __init__(self, variable):
        self.shape, self.dtype = variable.shape, variable.dtype

    def __repr__(self):
        return "<tf.Tensor: shape=%s, dtype=%s>" % (self.shape, self.dtype)


class Gradients(list):
    """What `tape.gradient` returns: the model's gradients, freed when
    CPython frees this list."""

    def __init__(self, model, sources):
        sources = list(sources) if not isinstance(sources, list) else sources
        list.__init__(self, [Gradient(v) for v in sources])
        self.model = model
        self._copies = []
        model._gradients = weakref.ref(self)

    @staticmethod
    def detach(model):
        """A new backward pass while older gradients live: they keep their
        bytes (as tensors of their own) and the pass makes new ones."""
        old = model._gradients() if model._gradients else None
        optimizer = model.engine_optimizer()
        if old is None or optimizer is None:
            return
        _vs.run(_vs.command("zero_grad", optimizer=optimizer, set_to_none=True))
        old._copies = [Tensor(g.shape, g.dtype, category="gradient", hint="gradients") for g in old]
        model._gradients = None

    def __del__(self):
        model = self.model
        if model._gradients is not None and model._gradients() is self:
            model._gradients = None
            optimizer = model.engine_optimizer()
            if optimizer is not None and model._name is not None:
                try:
                    _vs.run(_vs.command("zero_grad", optimizer=optimizer, set_to_none=True))
                except Exception:
                    pass

"""tf.compat.v1.Session: owns the variables of models built while open."""

import vramlab_shim as _vs


class _Session(_vs.Owner):
    def __init__(self, *a, **k):
        self._name = None
        name = _vs.fresh_name()
        _vs.run(_vs.command("tf_session", name=name))
        self._name = name

    def close(self):
        if self._name:
            _vs.run(_vs.command("close", name=self._name))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class v1:
    Session = _Session

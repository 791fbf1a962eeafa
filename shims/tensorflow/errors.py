import vramlab_shim as _vs


class ResourceExhaustedError(Exception):
    pass


_vs.raises("out_of_memory", ResourceExhaustedError)
_vs.raises("runtime_error", RuntimeError)
_vs.raises("invalid_value", ValueError)

import vramlab_shim as _vs


def clear_session(free_memory=True):
    _vs.run({"cmd": "clear_session"})

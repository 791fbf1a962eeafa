import vramlab_shim as _vs


def clear_session(free_memory=True):
    """Keras 3's: the global state goes, then (free_memory) gc.collect(),
    so models only Keras's state kept, and their cycles, are freed."""
    _vs.run(_vs.command("clear_session"))
    if free_memory:
        import gc

        gc.collect()

"""torch.utils.checkpoint: activation checkpointing, as the engine's step
runs it (each segment keeps only its input; backward runs the segment's
forward again)."""


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """The model's output with checkpointing on: the loss taken of it runs
    the engine's checkpointed forward."""
    out = functions(input)
    out.checkpointing = True
    return out

"""torch.autocast: the dtype the engine's step runs its products in."""

state = {"dtype": None}


class autocast:
    def __init__(self, device_type="cuda", dtype=None, enabled=True, **_):
        import torch

        self.dtype = (dtype or torch.float16) if enabled else None

    def __enter__(self):
        self.prev = state["dtype"]
        state["dtype"] = self.dtype
        return self

    def __exit__(self, *exc):
        state["dtype"] = self.prev
        return False


class GradScaler:
    """torch.amp.GradScaler: scales the loss; its state is a few scalars."""

    def __init__(self, *a, **k):
        pass

    def scale(self, loss):
        return loss

    def step(self, optimizer):
        optimizer.step()

    def update(self, *a):
        pass

    def unscale_(self, optimizer):
        pass

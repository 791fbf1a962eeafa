from torch.utils import checkpoint, data  # noqa: F401

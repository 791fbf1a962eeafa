"""torch.utils.data: datasets and loaders on the host; a batch takes GPU
memory when the code moves it there."""

import math

import torch


class Dataset:
    pass


class TensorDataset(Dataset):
    def __init__(self, *tensors):
        self.tensors = tensors

    def __len__(self):
        return self.tensors[0].shape[0]

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)


class DataLoader:
    def __init__(self, dataset, batch_size=1, shuffle=False, drop_last=False, **_):
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last

    def __len__(self):
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        n = len(self.dataset)
        tensors = getattr(self.dataset, "tensors", None)
        for i in range(len(self)):
            b = min(self.batch_size, n - i * self.batch_size)
            if tensors is None:
                yield torch.zeros(b)
            else:
                # Rows of a tensor on the GPU are views of it; from the host, new tensors.
                yield [
                    t._view((b,) + tuple(t.shape[1:])) if t.is_cuda else torch.zeros(b, *t.shape[1:], dtype=t.dtype)
                    for t in tensors
                ]


def random_split(dataset, lengths, generator=None):
    return [dataset for _ in lengths]

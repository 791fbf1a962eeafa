"""torch.nn.functional: the losses a step computes, and shape-only ops."""

import vramlab_shim as _vs


def cross_entropy(output, target, *a, **k):
    from torch.nn.engine import Loss, ModelOutput

    if isinstance(output, ModelOutput) and not output._storage._name:
        name = _vs.fresh_name()
        try:
            record = output.model.loss(output, target, name)
        except BaseException:
            _vs._live.discard(name)
            raise
        return Loss(name, record, keep=[output.model])
    return output._reduce()


nll_loss = cross_entropy


def mse_loss(output, target, *a, **k):
    return output._reduce()


def _same(x, *a, **k):
    return x._new(x.shape)


relu = gelu = silu = sigmoid = tanh = softmax = log_softmax = dropout = _same


def linear(x, weight, bias=None):
    return x @ weight.t()

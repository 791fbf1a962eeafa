#!/usr/bin/env python3
"""Real memory snapshots of CUDA graphs on a GPU, written by PyTorch itself
(`torch.cuda.memory._record_memory_history` + `_snapshot`, pickled as
`_dump_snapshot` does), for replaying CUDA graphs' private memory pools:

- `graph`: PyTorch's whole-network capture (the CUDA graphs section of
  its CUDA semantics notes): an MLP's forward, loss, backward and SGD step
  warmed up three times on a side stream, captured by `torch.cuda.graph`
  into a private pool, replayed five times with new data copied into the
  static tensors; the graph is alive when the snapshot is taken.
- `graph-freed`: the same, then the graph and its static outputs deleted,
  `torch.cuda.empty_cache()`, and a few eager steps in the default pools.
- `reduce-overhead`: `torch.compile(mode="reduce-overhead")` (CUDA graph
  trees) of the same MLP, trained five steps.

    python3 tests/reference/gpu_graph_snapshot.py MODE OUT.pickle
"""
import pickle
import sys

import torch
import torch.nn.functional as F

from gpu_snapshot import relative


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(256, 512, device="cuda"), torch.randint(0, 10, (256,), device="cuda"))
               for _ in range(5)]
    return model, opt, batches


def eager_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def captured(freed):
    model, opt, batches = model_and_data()
    static_x, static_y = batches[0][0].clone(), batches[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager_step(model, opt, static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = F.cross_entropy(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    for x, y in batches:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
    print("graph loss", static_loss.item(), file=sys.stderr)
    if freed:
        del graph, static_loss
        torch.cuda.empty_cache()
        for x, y in batches[:2]:
            eager_step(model, opt, x, y)
    torch.cuda.synchronize()


def reduce_overhead():
    model, opt, batches = model_and_data()
    compiled = torch.compile(model, mode="reduce-overhead")
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(compiled(x), y)
        loss.backward()
        opt.step()
    print("compiled loss", loss.item(), file=sys.stderr)
    torch.cuda.synchronize()


def main(mode, path):
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    {"graph": lambda: captured(False), "graph-freed": lambda: captured(True),
     "reduce-overhead": reduce_overhead}[mode]()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    pools = sorted({tuple(s["segment_pool_id"]) for s in snapshot["segments"]})
    print(mode, "segments", len(snapshot["segments"]), "pools", pools, file=sys.stderr)
    with open(path, "wb") as f:
        pickle.dump(relative(snapshot), f)  # as _dump_snapshot writes it


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

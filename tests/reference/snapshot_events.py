#!/usr/bin/env python3
"""The large requests of a PyTorch memory snapshot, in order: each
allocation over 1 MiB as its size, each free of one as minus its size
(the caching allocator's large pool, whose segments the layout decides).
Prints JSON: {"events": [...], "source": ...}.

    python3 tests/reference/snapshot_events.py SNAPSHOT.pickle > FILE.json

The snapshots came from `torch.cuda.memory._record_memory_history()` and
`_dump_snapshot()` around a run of tests/python/44-generate.py and
45-qlora.py on the H100 (see tests/golden/PROVENANCE.md).
"""
import json
import pickle
import sys


def events(path):
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    out = []
    for e in snapshot["device_traces"][0]:
        if e["size"] <= 1 << 20:
            continue
        if e["action"] == "alloc":
            out.append(e["size"])
        elif e["action"] == "free_requested":
            out.append(-e["size"])
    return out


if __name__ == "__main__":
    path = sys.argv[1]
    json.dump({"source": path.rsplit("/", 1)[-1], "events": events(path)}, sys.stdout, separators=(",", ":"))
    print()

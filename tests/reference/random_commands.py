#!/usr/bin/env python3
"""Writes COUNT random command files (tensor commands only) for the golden
comparison: sizes from 1 B to 1 GiB spread over the orders of magnitude,
del, hold with and without cycles, gc, empty_cache.

    python3 tests/reference/random_commands.py OUTDIR COUNT [SEED]
"""
import json
import os
import random
import sys


def one(rng, framework):
    names = ["a", "b", "c", "d", "e"]
    lines = [{"cmd": "restart", "framework": framework}]
    if framework == "jax":
        lines[0]["preallocate"] = False
    for _ in range(rng.randint(5, 60)):
        r = rng.random()
        if r < 0.5:
            bits = rng.randint(0, 29)
            lines.append({"cmd": "alloc", "name": rng.choice(names), "bytes": (1 << bits) + rng.randrange(1 << bits)})
        elif r < 0.75:
            lines.append({"cmd": "del", "name": rng.choice(names)})
        elif r < 0.85:
            lines.append({"cmd": "hold", "name": "h", "items": rng.sample(names, rng.randint(0, 3)),
                          "cycle": rng.random() < 0.5})
        elif r < 0.93:
            lines.append({"cmd": "gc"})
        else:
            lines.append({"cmd": "empty_cache"})
    return lines


if __name__ == "__main__":
    out, count = sys.argv[1], int(sys.argv[2])
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    os.makedirs(out, exist_ok=True)
    for i in range(count):
        framework = "pytorch" if i % 4 else "jax"
        with open(os.path.join(out, f"random-{i:04d}-{framework}.jsonl"), "w") as f:
            for line in one(rng, framework):
                f.write(json.dumps(line) + "\n")

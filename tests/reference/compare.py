#!/usr/bin/env python3
"""Compares two streams of `vramlab run` records step by step on the given
stats keys; prints every difference; exits 1 if there is any.

    python3 tests/reference/compare.py A.jsonl B.jsonl allocated_bytes reserved_bytes ...
"""
import json
import sys


def records(path):
    return [json.loads(l) for l in open(path) if l.strip().startswith('{"step"')]


a, b, keys = records(sys.argv[1]), records(sys.argv[2]), sys.argv[3:]
diffs = 0
if len(a) != len(b):
    print(f"{sys.argv[1]}: {len(a)} records, {sys.argv[2]}: {len(b)}")
    diffs += 1
for ra, rb in zip(a, b):
    for k in keys:
        va, vb = ra.get("stats", {}).get(k), rb.get("stats", {}).get(k)
        if va != vb:
            diffs += 1
            print(f"step {ra['step']} {json.dumps(ra['cmd'])}: {k} {va} != {vb}")
    if ra.get("ok") != rb.get("ok"):
        diffs += 1
        print(f"step {ra['step']}: ok {ra.get('ok')} != {rb.get('ok')}")
print(f"{sys.argv[1]} vs {sys.argv[2]}: {diffs} difference(s)")
sys.exit(1 if diffs else 0)

"""What XLA's GPU client preallocates for XLA_PYTHON_CLIENT_MEM_FRACTION:
`pool_bytes` and `bytes_limit` after one small array, for fractions of the
card that stand in for a smaller card's 50% and 75%, each given exactly,
a hair over and a hair under.

    python3 tests/reference/xla_fraction.py
"""
import json, math, os, subprocess, sys

PROBE = ("import jax, jax.numpy as jnp, json; x = jnp.zeros(1); x.block_until_ready();"
         "s = jax.devices()[0].memory_stats(); print(json.dumps({k: s.get(k) for k in"
         " ('pool_bytes', 'bytes_limit', 'bytes_reserved', 'bytes_in_use')}))")
total = int(subprocess.check_output([sys.executable, "-c",
                                     "import torch; print(torch.cuda.mem_get_info()[1])"]).strip())
for share in (0.5, 0.75):
    target = int(share * 16 * 2**30)
    f = target / total
    for name, frac in (("exact", f), ("over", math.nextafter(f, 1)), ("under", math.nextafter(f, 0)),
                       ("9 digits", float("%.9f" % f))):
        env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="true", XLA_PYTHON_CLIENT_MEM_FRACTION=repr(frac))
        out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
        print(json.dumps({"target": target, "fraction": name, "fraction_times_total": frac * total,
                          "stats": out.stdout.strip() or out.stderr.strip()[-300:]}))

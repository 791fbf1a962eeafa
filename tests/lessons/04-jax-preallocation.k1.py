# Start JAX with its defaults.
# vramlab python --settings '{"framework":"jax","device_total_bytes":17179869184,"context_bytes":314572800,"preallocate":true,"mem_fraction":0.75}'
import numpy as np
import jax
import jax.numpy as jnp

# x = jnp.zeros(2**20, jnp.uint8)
x = jnp.zeros((1 * 2**20,), jnp.uint8)
# → The first operation preallocates 75% of the GPU's total memory as one pool; x
# takes 1 MiB of it.

del x

# (JAX has no empty_cache)
# JAX has no empty_cache(): its BFC pool keeps what it reserved

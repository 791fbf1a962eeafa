# Restart with XLA_PYTHON_CLIENT_PREALLOCATE=false
# vramlab python --settings '{"framework":"jax","device_total_bytes":17179869184,"context_bytes":314572800,"preallocate":false,"mem_fraction":0.5}'
import numpy as np
import jax
import jax.numpy as jnp

# x = jnp.zeros(2**20, jnp.uint8)
x = jnp.zeros((1 * 2**20,), jnp.uint8)
# → Without preallocation the pool starts with a 2 MiB region and grows as needed.
# jnp.zeros first puts its fill value on the device (two 256-byte scalars, freed again),
# so the 1 MiB array is handed the rest of the region whole: 2 MiB less 512 bytes, as
# JAX 0.11 counts it on an H100.

# y = jnp.zeros(100 * 2**20, jnp.uint8)
y = jnp.zeros((100 * 2**20,), jnp.uint8)
# → The region size doubles until it holds 100 MiB: a 128 MiB region, handed out whole
# (less than twice the request, slack under 128 MiB).

del y

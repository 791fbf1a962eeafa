# Restart with XLA_PYTHON_CLIENT_MEM_FRACTION=.50
# vramlab python --settings '{"framework":"jax","device_total_bytes":17179869184,"context_bytes":314572800,"preallocate":true,"mem_fraction":0.5}'
import numpy as np
import jax
import jax.numpy as jnp

# x = jnp.zeros(2**20, jnp.uint8)
x = jnp.zeros((1 * 2**20,), jnp.uint8)

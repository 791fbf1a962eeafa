import jax
import jax.numpy as jnp

x = jnp.zeros((1024, 1024))
stats = jax.devices()[0].memory_stats()
print(stats["bytes_in_use"], stats["bytes_limit"], stats["pool_bytes"])
key = jax.random.PRNGKey(0)
y = jax.random.normal(key, (1024, 1024))
z = x @ y
print(z.shape, z.dtype)
print(jax.devices()[0].memory_stats()["bytes_in_use"])
del x
y.delete()
print(jax.devices()[0].memory_stats()["bytes_in_use"], len(jax.live_arrays()))
h = jnp.ones(256, dtype=jnp.float64)
print(h.dtype, h.nbytes)

import jax
import jax.numpy as jnp


@jax.jit
def layer(w, x):
    return jnp.tanh(x @ w)


def run(steps):
    key = jax.random.PRNGKey(0)
    w = jax.random.normal(key, (1024, 1024))
    x = jnp.ones((64, 1024))
    for _ in range(steps):
        x = layer(w, x)
    return x.block_until_ready()


out = run(3)
print(out.shape, jax.devices()[0].memory_stats()["bytes_in_use"])
del out
print(jax.devices()[0].memory_stats()["bytes_in_use"])

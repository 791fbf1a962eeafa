import jax
import jax.numpy as jnp
import optax


def init_params(key, sizes):
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (n_in, n_out)) * 0.01, jnp.zeros(n_out)))
    return params


def loss_fn(params, x, y):
    for w, b in params[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)


params = init_params(jax.random.PRNGKey(0), [1024, 1024, 1024, 10])
optimizer = optax.adam(1e-3)
opt_state = optimizer.init(params)
n = sum(p.size for p in jax.tree.leaves(params))
print("parameters:", n, "state arrays:", len(jax.tree.leaves(opt_state)))


@jax.jit
def step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


x, y = jnp.ones((256, 1024)), jnp.zeros((256, 10))
for i in range(3):
    params, opt_state, loss = step(params, opt_state, x, y)
print("in use:", jax.devices()[0].memory_stats()["bytes_in_use"])

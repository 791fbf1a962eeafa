import numpy as np
import torch
import jax.numpy as jnp
a = np.zeros((4, 6)).reshape(-1, 3)
print(a.shape, len(a))
t = torch.zeros(4, 6, device="cuda").view(2, -1)
print(t.shape)
j = jnp.zeros((4, 6)).reshape((3, -1))
print(j.shape, j.nbytes)
try:
    np.zeros(5).reshape(2, 2)
except ValueError as e:
    print(e)
try:
    torch.zeros(5).view(2, 2)
except RuntimeError as e:
    print(e)

# Start TensorFlow with default GPU options (no memory growth) on a 16 GiB GPU of
# compute capability 8.9.
# vramlab python --settings '{"framework":"tensorflow","compute_capability":[8,9],"device_total_bytes":17179869184,"context_bytes":314572800,"allow_growth":false}'
import numpy as np
import tensorflow as tf

# x = tf.zeros([256, 1024, 1024])
x = tf.zeros([256, 1024, 1024], tf.float32)
# → TensorFlow's first op allocates its 1,028-byte scratch buffer (1,280 bytes in the
# pool) before its output; and the first allocation makes the BFC allocator take its
# whole memory limit as one region: free memory minus 1536 MiB kept for the system.

# w = tf.Variable(...) # 512 MiB of weights
w = tf.zeros([512 * 2**20], tf.uint8)

# layer = [w]; layer.append(layer) # a model graph with a cycle
layer = [w]
layer.append(layer)  # a reference cycle

del w

del layer
# → The cycle keeps the weights alive.

del x
# → x's bytes go back into the BFC pool: bytes_in_use falls, the pool does not.

tf.keras.backend.clear_session()
# → clear_session resets Keras's global state and runs gc.collect(): the cycle is
# freed inside the pool. Only the GPU device's own scratch buffer (1,280 bytes) stays in
# use. The pool, and nvidia-smi, stay exactly where they were.

# torch.cuda.empty_cache() # what people try next
# TensorFlow has no empty_cache(): its BFC pool keeps what it reserved
# → TensorFlow has no such call; its allocator returns memory only when the process
# exits.

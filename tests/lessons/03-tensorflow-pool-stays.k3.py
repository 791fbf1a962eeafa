# Restart with tf.config.experimental.set_memory_growth(gpu, True)
# vramlab python --settings '{"framework":"tensorflow","compute_capability":[8,9],"device_total_bytes":17179869184,"context_bytes":314572800,"allow_growth":true}'
import numpy as np
import tensorflow as tf

# x = tf.zeros([2**30], tf.uint8)
x = tf.zeros([1024 * 2**20], tf.uint8)
# → The first op's scratch buffer took the first region (2 MiB, where growth starts);
# then the region size doubles until it holds the request: a 1 GiB region beside it.

y = tf.zeros([4 * 2**20], tf.uint8)
# → No free chunk is big enough (the scratch buffer's region has under 2 MiB left), so
# the pool grows by another region of the current size (1 GiB).

del x

del y
# → Growth only ever grows: both regions stay in the pool.

# Start TensorFlow 1-style.
# vramlab python --settings '{"framework":"tensorflow","allow_growth":true}'
import numpy as np
import tensorflow as tf

sess = tf.compat.v1.Session()

# model = build_model() # variables created in sess
model = tf.keras.Sequential([tf.keras.Input(shape=(784,))] + [tf.keras.layers.Dense(256, activation='relu') for _ in range(1)] + [tf.keras.layers.Dense(10)])

del model
# → The session owns the variables: nothing is freed.

sess.close()
# → Closing the session frees its variables inside the BFC pool; the pool itself stays
# for the life of the process, and so does the GPU device's scratch buffer (1,028 bytes,
# 1,280 in the pool), which TensorFlow's first op allocated.

# Start TensorFlow with memory growth.
# vramlab python --settings '{"framework":"tensorflow","allow_growth":true}'
import numpy as np
import tensorflow as tf

# model = build_model() # iteration 1
model = tf.keras.Sequential([tf.keras.Input(shape=(784,))] + [tf.keras.layers.Dense(256, activation='relu') for _ in range(1)] + [tf.keras.layers.Dense(10)])

# model = build_model() # iteration 2
model = tf.keras.Sequential([tf.keras.Input(shape=(784,))] + [tf.keras.layers.Dense(256, activation='relu') for _ in range(1)] + [tf.keras.layers.Dense(10)])
# → Keras's global state holds every model built: rebinding `model` does not free the
# old one.

# model = build_model() # iteration 3
model = tf.keras.Sequential([tf.keras.Input(shape=(784,))] + [tf.keras.layers.Dense(256, activation='relu') for _ in range(1)] + [tf.keras.layers.Dense(10)])

tf.keras.backend.clear_session()
# → Keras forgets its models; the two not bound to a name die. bytes_in_use falls; the
# pool stays.

# tf.keras.backend.clear_session() # at the top of each iteration
tf.keras.backend.clear_session()

# model = build_model()
model = tf.keras.Sequential([tf.keras.Input(shape=(784,))] + [tf.keras.layers.Dense(256, activation='relu') for _ in range(1)] + [tf.keras.layers.Dense(10)])
# → With clear_session() each iteration, memory in use stays flat.

# tf.keras.backend.clear_session() # at the top of each iteration
tf.keras.backend.clear_session()

# model = build_model()
model = tf.keras.Sequential([tf.keras.Input(shape=(784,))] + [tf.keras.layers.Dense(256, activation='relu') for _ in range(1)] + [tf.keras.layers.Dense(10)])
# → With clear_session() each iteration, memory in use stays flat.

# tf.keras.backend.clear_session() # at the top of each iteration
tf.keras.backend.clear_session()

# model = build_model()
model = tf.keras.Sequential([tf.keras.Input(shape=(784,))] + [tf.keras.layers.Dense(256, activation='relu') for _ in range(1)] + [tf.keras.layers.Dense(10)])
# → With clear_session() each iteration, memory in use stays flat.

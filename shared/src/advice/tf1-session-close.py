# The advice (TensorFlow 1): "close the session and open a new one to free memory"
import tensorflow as tf

sess = tf.compat.v1.Session()
model = tf.keras.Sequential([
    tf.keras.Input(shape=(784,)),
    tf.keras.layers.Dense(4096, activation="relu"),
    tf.keras.layers.Dense(10),
])
sess.close()
sess = tf.compat.v1.Session()

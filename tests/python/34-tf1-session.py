import tensorflow as tf

sess = tf.compat.v1.Session()
model = tf.keras.Sequential([
    tf.keras.Input(shape=(784,)),
    tf.keras.layers.Dense(4096, activation="relu"),
    tf.keras.layers.Dense(10),
])
print("built:", tf.config.experimental.get_memory_info("GPU:0")["current"])
sess.close()
print("closed:", tf.config.experimental.get_memory_info("GPU:0")["current"])

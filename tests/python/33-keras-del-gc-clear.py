import gc

import tensorflow as tf

(x_train, y_train), _ = tf.keras.datasets.mnist.load_data()
model = tf.keras.Sequential([
    tf.keras.layers.Flatten(input_shape=(28, 28)),
    tf.keras.layers.Dense(1024, activation="relu"),
    tf.keras.layers.Dense(1024, activation="relu"),
    tf.keras.layers.Dense(10),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(x_train, y_train, batch_size=64, epochs=1, steps_per_epoch=20)
trained = tf.config.experimental.get_memory_info("GPU:0")["current"]
del model
print("del model frees", trained - tf.config.experimental.get_memory_info("GPU:0")["current"])
gc.collect()
print("gc.collect() leaves", tf.config.experimental.get_memory_info("GPU:0")["current"])
tf.keras.backend.clear_session()
print("clear_session() leaves", tf.config.experimental.get_memory_info("GPU:0")["current"])

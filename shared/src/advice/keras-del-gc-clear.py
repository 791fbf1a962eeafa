# The advice: "del the model, run gc.collect(), then clear_session()"
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
del model
gc.collect()
tf.keras.backend.clear_session()

# The advice: "call tf.keras.backend.clear_session() after training to free GPU memory"
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
tf.keras.backend.clear_session()

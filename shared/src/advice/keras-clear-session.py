# The advice: "call tf.keras.backend.clear_session() after training to free GPU memory"
import tensorflow as tf


def build_model():
    model = tf.keras.Sequential([
        tf.keras.layers.Flatten(input_shape=(28, 28)),
        tf.keras.layers.Dense(1024, activation="relu"),
        tf.keras.layers.Dense(1024, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam",
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def gpu_memory():
    info = tf.config.experimental.get_memory_info("GPU:0")
    return f"current {info['current'] / 2**20:.1f} MiB, peak {info['peak'] / 2**20:.1f} MiB"


(x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
x_train, x_test = x_train / 255.0, x_test / 255.0
model = build_model()
model.fit(x_train, y_train, batch_size=64, epochs=1, steps_per_epoch=20)
print("after fit:", gpu_memory())
tf.keras.backend.clear_session()
print("after clear_session():", gpu_memory())

import tensorflow as tf

inputs = tf.keras.Input(shape=(784,))
hidden = tf.keras.layers.Dense(1024, activation="relu")(inputs)
outputs = tf.keras.layers.Dense(10)(hidden)
model = tf.keras.Model(inputs=inputs, outputs=outputs)
optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

x = tf.random.normal((256, 784))
y = tf.zeros((256,), dtype=tf.int64)


def mib(n):
    return "%.2f MiB" % (n / 2**20)


for step in range(3):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    print("step", step, mib(tf.config.experimental.get_memory_info("GPU:0")["current"]))

del grads
print("del grads", mib(tf.config.experimental.get_memory_info("GPU:0")["current"]))
print("peak", mib(tf.config.experimental.get_memory_info("GPU:0")["peak"]))

import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([
    tf.keras.Input(shape=(784,)),
    tf.keras.layers.Dense(256, activation="relu"),
    tf.keras.layers.Dense(10),
])
opt = tf.keras.optimizers.Adam(1e-3)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
model.compile(optimizer=opt, loss=loss_fn)

x, y = np.random.rand(64, 784).astype("float32"), np.random.randint(0, 10, 64)
with tf.GradientTape() as tape:
    loss = loss_fn(y, model(x, training=True))
grads = tape.gradient(loss, model.trainable_variables)
opt.apply_gradients(zip(grads, model.trainable_variables))
del grads, tape, loss
after_step = tf.config.experimental.get_memory_info("GPU:0")["current"]
# fit steps with the same optimizer: its state (made once) is not made again.
model.fit(np.random.rand(640, 784).astype("float32"), np.random.randint(0, 10, 640), batch_size=64, epochs=1)
print(model.optimizer is opt, after_step, tf.config.experimental.get_memory_info("GPU:0")["current"])

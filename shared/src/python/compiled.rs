//! The Python of JAX and Keras, whose training step XLA compiles: the
//! parameters as arrays (JAX), optax's or Keras's optimizer, numpy
//! batches, and the step as `jax.jit` or `fit`.

use crate::command::{DataArgs, ModelArgs, OptimizerArgs, TrainArgs};
use crate::types::Framework;

/// JAX's parameters: a pytree of arrays on the device.
pub(super) fn params_code(a: &ModelArgs) -> String {
    let name = &a.name;
    if let Some(module) = super::kind_code(a) {
        // `name = CNN(...).cuda()  # ...`: the same module's shapes, as arrays.
        let module = module.split_once(" = ").map_or("", |(_, m)| m);
        let module = module
            .split("  # ")
            .next()
            .unwrap_or("")
            .replace(".cuda()", "");
        return format!("{name} = init_params(jax.random.key(0), {module})");
    }
    let dims: Vec<String> = std::iter::once(a.input_dim)
        .chain(std::iter::repeat_n(a.width(), a.layers as usize))
        .chain([a.classes])
        .map(|d| d.to_string())
        .collect();
    format!(
        "dims = [{}]\n{name} = [(jnp.zeros((i, o)), jnp.zeros((o,))) for i, o in zip(dims[:-1], dims[1:])]",
        dims.join(", ")
    )
}

/// optax's optimizer and its state (JAX), or Keras's, compiled with the
/// model.
pub(super) fn optimizer_code(a: &OptimizerArgs, framework: Framework) -> String {
    let (name, model) = (&a.name, &a.model);
    let rule = a.kind.written_in(framework, a.lr);
    match framework {
        Framework::Jax => format!("{name} = {rule}\n{name}_state = {name}.init({model})"),
        _ => format!("{name} = {rule}\n{model}.compile(optimizer={name}, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))"),
    }
}

/// The samples as numpy arrays on the host.
pub(super) fn data_code(a: &DataArgs) -> String {
    format!(
        "x_train, y_train = np.asarray(X), np.asarray(y)  # {} x {}, on the host",
        a.samples, a.features
    )
}

/// A step compiled by XLA: JAX's `jax.jit` (donating when asked), or
/// Keras's `fit` (XLA on a GPU by default; TensorFlow's executor with
/// `jit_compile` off).
pub(super) fn train_code(a: &TrainArgs, framework: Framework) -> String {
    let (model, opt, steps, batch) = (&a.model, &a.optimizer, a.steps, a.batch_size);
    if framework == Framework::Tensorflow {
        let fit = format!(
            "{model}.fit(x_train, y_train, batch_size={batch}, steps_per_epoch={steps}, epochs=1)"
        );
        return match a.jit_compile {
            true => format!("{fit}  # XLA on a GPU"),
            false => format!("{model}.jit_compile = False  # no XLA: TensorFlow's executor\n{fit}"),
        };
    }
    let jit = if a.donate {
        "@partial(jax.jit, donate_argnums=(0, 1))  # new params and state written over the old"
    } else {
        "@jax.jit"
    };
    format!(
        "{jit}\ndef train_step(params, opt_state, x, y):\n    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)\n    updates, opt_state = {opt}.update(grads, opt_state, params)\n    return optax.apply_updates(params, updates), opt_state, loss\n\n\
for step, (x, y) in zip(range({steps}), batches(x_train, y_train, {batch})):\n    x, y = jnp.asarray(x), jnp.asarray(y)\n    {model}, {opt}_state, loss = train_step({model}, {opt}_state, x, y)"
    )
}

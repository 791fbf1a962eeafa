//! Keras's `model.compile(optimizer=...)` (the optimizer, its state made at
//! the first step) and `model.fit(x, y, ...)` (the training loop, the
//! arrays copied to the GPU batch by batch).

use super::library::samples_features;
use super::scope::Eval;
use super::value::{Args, Value};
use super::CellError;
use crate::command::*;
use crate::train::OptimizerKind;

/// The optimizer `compile` makes for `model`.
pub fn optimizer_name(model: &str) -> String {
    format!("{model}_optimizer")
}

/// The dataset `fit` reads for `model`.
pub fn data_name(model: &str) -> String {
    format!("{model}_data")
}

pub fn method(ev: &Eval, model: &str, m: &str, args: &Args) -> Result<Value, CellError> {
    match m {
        "compile" => compile(ev, model, args),
        _ => fit(ev, model, args),
    }
}

/// `compile(optimizer=..., jit_compile=...)`: `"auto"` (XLA on a GPU)
/// unless `False`.
fn compile(ev: &Eval, model: &str, args: &Args) -> Result<Value, CellError> {
    let (kind, lr) = optimizer_kind(ev, args.get(0, "optimizer"))?;
    let jit_compile = !matches!(args.kw("jit_compile"), Some(Value::Bool(false)));
    let optimizer = Command::Optimizer(OptimizerArgs {
        name: optimizer_name(model),
        model: model.to_string(),
        kind,
        lr,
        bits: crate::command::STATE_BITS,
    });
    Ok(Value::Compile(vec![optimizer], jit_compile))
}

fn fit(ev: &Eval, model: &str, args: &Args) -> Result<Value, CellError> {
    let Some(Some(optimizer)) = ev.names.keras(model) else {
        return Err(ev.err(format!(
            "`{model}.fit` needs `{model}.compile(optimizer=...)` first"
        )));
    };
    let Some(Value::Tensor(x)) = args.get(0, "x") else {
        return Err(ev.err("fit(x, y, ...) takes arrays made in the cell (for instance from keras.datasets.mnist.load_data())"));
    };
    let (samples, features) = samples_features(ev, &x.shape)?;
    let batch = positive(ev, args.get(2, "batch_size"), 32, "batch_size")?;
    let epochs = positive(ev, args.get(3, "epochs"), 1, "epochs")?;
    let per_epoch = positive(
        ev,
        args.kw("steps_per_epoch"),
        samples.div_ceil(batch),
        "steps_per_epoch",
    )?;
    let data = data_name(model);
    let mut commands = Vec::new();
    if ev.names.loader(&data).is_none() {
        commands.push(Command::Data(DataArgs {
            name: data.clone(),
            samples,
            features,
            classes: DEFAULT_CLASSES,
            on_device: x.gpu,
        }));
    }
    let steps = per_epoch.saturating_mul(epochs);
    let mut train = TrainArgs::plain(model, optimizer, &data, steps, batch);
    train.jit_compile = ev.names.jit_compile(model);
    commands.push(Command::Train(train));
    Ok(Value::Effect(commands))
}

fn positive(ev: &Eval, v: Option<&Value>, default: u64, what: &str) -> Result<u64, CellError> {
    match v {
        None | Some(Value::None) => Ok(default),
        Some(v) => v
            .count()
            .ok_or_else(|| ev.err(format!("{what} must be a positive whole number"))),
    }
}

/// `optimizer="adam"` or a Keras optimizer object.
pub fn optimizer_kind(
    ev: &Eval,
    v: Option<&Value>,
) -> Result<(OptimizerKind, Option<f32>), CellError> {
    match v {
        Some(Value::Optimizer(spec, lr, _)) => Ok((spec.kind, *lr)),
        Some(Value::Str(s)) => match s.to_ascii_lowercase().as_str() {
            "adam" => Ok((OptimizerKind::Adam, None)),
            "adamw" => Ok((OptimizerKind::Adamw, None)),
            "sgd" => Ok((OptimizerKind::Sgd, None)),
            other => Err(ev.err(format!("optimizer {other:?}: the cell knows \"sgd\", \"adam\" and \"adamw\""))),
        },
        _ => Err(ev.err("compile needs optimizer=\"adam\" (or \"sgd\", \"adamw\", or a keras.optimizers object)")),
    }
}

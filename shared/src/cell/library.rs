//! The functions the cell knows, by canonical path (see [`super::names`]):
//! tensor factories of PyTorch, TensorFlow, JAX and NumPy, layers and
//! models, optimizers, data loaders, and the calls people make to free
//! memory.

use super::names::framework_of;
use super::scope::Eval;
use super::value::{dtype_named, Args, Forward, Loader, TensorInfo, Value};
use super::CellError;
use crate::command::STATE_BITS;
use crate::command::{Command, ModelArgs};
use crate::train::{OptimizerKind, OptimizerSpec};
use crate::types::{Dtype, Framework};

/// MNIST and CIFAR-10 as `load_data()` returns them (train, then test).
const DATASETS: [(&str, [u64; 3]); 3] = [
    ("mnist", [28, 28, 1]),
    ("fashion_mnist", [28, 28, 1]),
    ("cifar10", [32, 32, 3]),
];

pub fn call(ev: &Eval, path: &str, args: &Args) -> Result<Value, CellError> {
    if let Some(v) = effect(path) {
        return Ok(Value::Effect(vec![v]));
    }
    if let Some(v) = builtin(ev, path, args)? {
        return Ok(v);
    }
    if let Some(v) = factory(ev, path, args)? {
        return on_device(ev, path, v);
    }
    if let Some(v) = module(ev, path, args)? {
        return Ok(v);
    }
    if quiet(path) {
        return Ok(Value::None);
    }
    Err(ev.err(format!(
        "`{path}(...)` is not in the cell's Python: see \"What the cell understands\" for the functions it runs"
    )))
}

/// Calls that change memory and take no arguments.
fn effect(path: &str) -> Option<Command> {
    Some(match path {
        "gc.collect" => Command::Gc {},
        "torch.cuda.empty_cache" => Command::EmptyCache {},
        "torch.cuda.reset_peak_memory_stats" | "tf.config.experimental.reset_memory_stats" => {
            Command::ResetPeakMemoryStats {}
        }
        "torch._C._cuda_clearCublasWorkspaces" => Command::ClearCublasWorkspaces {},
        "keras.backend.clear_session" | "keras.utils.clear_session" => Command::ClearSession {},
        _ => return None,
    })
}

/// Calls that only read (or print): they run and change nothing.
fn quiet(path: &str) -> bool {
    [
        "torch.cuda.memory_allocated",
        "torch.cuda.memory_reserved",
        "torch.cuda.max_memory_allocated",
        "torch.cuda.memory_summary",
        "torch.cuda.memory_stats",
        "torch.cuda.mem_get_info",
        "torch.cuda.synchronize",
        "torch.manual_seed",
        "tf.config.experimental.get_memory_info",
        "tf.random.set_seed",
        "jax.random.PRNGKey",
        "jax.random.key",
        "jax.devices",
        "np.random.seed",
    ]
    .contains(&path)
}

fn builtin(ev: &Eval, path: &str, args: &Args) -> Result<Option<Value>, CellError> {
    let first = args.pos.first().cloned().unwrap_or(Value::None);
    Ok(Some(match path {
        "builtins.print" => Value::None,
        "builtins.range" => range(ev, args)?,
        "builtins.iter" => match first {
            Value::Object(l) if ev.names.loader(&l).is_some() => Value::Batch(l),
            other => other,
        },
        "builtins.next" => match first {
            Value::Batch(l) => Value::Tuple(vec![Value::Batch(l.clone()), Value::Batch(l)]),
            _ => Value::Opaque,
        },
        _ => return Ok(None),
    }))
}

fn range(ev: &Eval, args: &Args) -> Result<Value, CellError> {
    let ints: Vec<i128> = args.pos.iter().filter_map(Value::int).collect();
    let (start, stop) = match ints[..] {
        [stop] => (0, stop),
        [start, stop, ..] => (start, stop),
        _ => return Err(ev.err("range() takes whole numbers")),
    };
    if stop - start > 10_000 {
        return Err(ev.err("a range of more than 10,000 numbers outside a training loop is more than the cell unrolls"));
    }
    Ok(Value::List((start..stop).map(Value::Int).collect()))
}

/// A tensor made by a factory: its shape and dtype, and where it lives.
fn factory(ev: &Eval, path: &str, args: &Args) -> Result<Option<Value>, CellError> {
    let (name, gpu_default, default_dtype) = match path.rsplit_once('.') {
        Some(("torch", f)) => (f, false, Dtype::Float32),
        Some(("tf" | "tf.random", f)) => (f, true, Dtype::Float32),
        Some(("jnp" | "jax.random", f)) => (f, true, Dtype::Float32),
        Some(("np" | "np.random", f)) => (f, false, Dtype::Float64),
        _ => return Ok(None),
    };
    let shape = match (path, name) {
        (
            _,
            "empty" | "zeros" | "ones" | "rand" | "randn" | "normal" | "uniform" | "fill" | "full",
        ) => factory_shape(ev, path, args)?,
        (_, "randint") => args
            .get(2, "size")
            .and_then(Value::shape)
            .ok_or_else(|| ev.err("randint needs a size"))?,
        (_, "arange") => vec![args
            .pos
            .last()
            .and_then(Value::int)
            .and_then(|i| u64::try_from(i).ok())
            .unwrap_or(0)],
        _ => return Ok(None),
    };
    let positional = args.pos.iter().find_map(|v| match v {
        Value::Dtype(d) => Some(*d),
        _ => None,
    });
    let dtype = match args.dtype("dtype").map_err(|m| ev.err(m))?.or(positional) {
        Some(d) => d,
        None if matches!(name, "randint" | "arange") => Dtype::Int64,
        None => default_dtype,
    };
    let gpu = args.device().unwrap_or(gpu_default);
    Ok(Some(Value::Tensor(TensorInfo { shape, dtype, gpu })))
}

/// The shape: positional sizes (`torch.randn(3, 4)`), or one tuple or list
/// (`tf.zeros([3, 4])`; JAX's random functions take the key first).
fn factory_shape(ev: &Eval, path: &str, args: &Args) -> Result<Vec<u64>, CellError> {
    let skip = usize::from(path.starts_with("jax.random."));
    let given: &[Value] = args.pos.get(skip..).unwrap_or_default();
    let fill = path.ends_with(".full") || path.ends_with(".fill");
    let sizes = match given {
        [] => args.kw("shape").or(args.kw("size")).and_then(Value::shape),
        [one, ..] if matches!(one, Value::Tuple(_) | Value::List(_)) => one.shape(),
        _ if path.starts_with("torch.") && !fill => Value::Tuple(
            given
                .iter()
                .take_while(|v| v.int().is_some())
                .cloned()
                .collect(),
        )
        .shape(),
        [one, ..] => one.shape(),
    };
    sizes.ok_or_else(|| ev.err(format!("`{path}` needs a shape of whole numbers")))
}

/// A GPU tensor must come from the kernel's framework.
fn on_device(ev: &Eval, path: &str, v: Value) -> Result<Value, CellError> {
    if let (Value::Tensor(t), Some(f)) = (&v, framework_of(path)) {
        if t.gpu && f != ev.framework {
            return Err(wrong_framework(ev, path, f));
        }
    }
    Ok(v)
}

pub fn wrong_framework(ev: &Eval, path: &str, f: Framework) -> CellError {
    ev.err(format!(
        "`{path}` is {}, but this kernel runs {}: pick {} above (the kernel restarts), then run the cell",
        f.display_name(),
        ev.framework.display_name(),
        f.display_name()
    ))
}

/// Layers, models, optimizers, data, sessions.
fn module(ev: &Eval, path: &str, args: &Args) -> Result<Option<Value>, CellError> {
    if let Some(f) = framework_of(path) {
        if f != ev.framework && !path.starts_with("keras.datasets") {
            return Err(wrong_framework(ev, path, f));
        }
    }
    let first = args.pos.first().cloned().unwrap_or(Value::None);
    Ok(Some(match path {
        "nn.Linear" => linear(ev, args)?,
        "nn.Sequential" => sequential(ev, &args.pos, false)?,
        "keras.Sequential" | "keras.models.Sequential" => match first {
            Value::List(layers) => sequential(ev, &layers, true)?,
            _ => return Err(ev.err("keras.Sequential takes a list of layers")),
        },
        "keras.layers.Dense" => dense(ev, args)?,
        "keras.Input" | "keras.layers.Input" | "keras.layers.InputLayer" => input(ev, args)?,
        "keras.layers.Flatten" => args
            .kw("input_shape")
            .map_or(Ok(Value::Layer(None)), |s| features(ev, s))?,
        p if p.starts_with("nn.") && p[3..].ends_with("Loss") => Value::Criterion,
        p if p.starts_with("nn.") || p.starts_with("keras.layers.") => Value::Layer(None),
        "F.cross_entropy" | "F.nll_loss" | "F.mse_loss" => loss_of(ev, args)?,
        p if ["torch.optim.", "keras.optimizers.", "bnb.optim."]
            .iter()
            .any(|m| p.starts_with(m)) =>
        {
            optimizer(ev, p, args)?
        }
        "torch.utils.data.TensorDataset" => dataset(ev, args)?,
        "torch.utils.data.DataLoader" => loader(ev, args)?,
        "checkpoint.checkpoint_sequential" => checkpointed(ev, args)?,
        "torch.device" => {
            Value::Device(matches!(first, Value::Str(s) if super::value::is_cuda(&s)))
        }
        "tf.compat.v1.Session" | "tf.Session" => Value::Session,
        "jax.device_put"
        | "jnp.array"
        | "jnp.asarray"
        | "tf.constant"
        | "tf.convert_to_tensor"
        | "tf.Variable" => to_gpu(ev, first)?,
        p if p.starts_with("keras.datasets.") && p.ends_with(".load_data") => load_data(ev, p)?,
        _ => return Ok(None),
    }))
}

fn whole(ev: &Eval, v: Option<&Value>, what: &str) -> Result<u64, CellError> {
    v.and_then(Value::count)
        .ok_or_else(|| ev.err(format!("{what} must be a positive whole number")))
}

fn linear(ev: &Eval, args: &Args) -> Result<Value, CellError> {
    let inputs = whole(ev, args.get(0, "in_features"), "in_features")?;
    let outputs = whole(ev, args.get(1, "out_features"), "out_features")?;
    Ok(Value::Layer(Some((Some(inputs), outputs))))
}

fn dense(ev: &Eval, args: &Args) -> Result<Value, CellError> {
    let units = whole(ev, args.get(0, "units"), "units")?;
    let inputs = match args.kw("input_shape").or(args.kw("input_dim")) {
        Some(s) => match features(ev, s)? {
            Value::Input(n) => Some(n),
            _ => None,
        },
        None => None,
    };
    Ok(Value::Layer(Some((inputs, units))))
}

fn input(ev: &Eval, args: &Args) -> Result<Value, CellError> {
    let shape = args
        .get(0, "shape")
        .ok_or_else(|| ev.err("keras.Input needs shape="))?;
    features(ev, shape)
}

/// The features an input shape flattens to.
fn features(ev: &Eval, shape: &Value) -> Result<Value, CellError> {
    let dims = shape
        .shape()
        .ok_or_else(|| ev.err("an input shape is whole numbers"))?;
    Ok(Value::Input(dims.iter().product()))
}

/// An MLP from its layers: every hidden layer must have one width (the
/// model vramlab trains).
fn sequential(ev: &Eval, layers: &[Value], keras: bool) -> Result<Value, CellError> {
    let mut input_dim = None;
    let mut sizes = Vec::new();
    for layer in layers {
        match layer {
            Value::Input(n) => input_dim = Some(*n),
            Value::Layer(Some((inputs, outputs))) => {
                if sizes.is_empty() {
                    input_dim = input_dim.or(*inputs);
                }
                sizes.push(*outputs);
            }
            Value::Layer(None) => {}
            other => return Err(ev.err(format!("{} is not a layer", other.describe()))),
        }
    }
    let Some((&classes, hidden)) = sizes.split_last() else {
        return Err(ev.err("the model needs at least one Linear (Dense) layer"));
    };
    let width = hidden.first().copied().unwrap_or(classes);
    if hidden.iter().any(|&w| w != width) {
        return Err(ev.err(
            "vramlab trains MLPs whose hidden layers share one width: give every hidden layer the same size",
        ));
    }
    Ok(Value::Model(ModelArgs {
        layers: hidden.len().max(1) as u32,
        width: Some(width),
        input_dim: input_dim.unwrap_or(crate::command::DEFAULT_FEATURES),
        classes,
        keras,
        ..Default::default()
    }))
}

fn optimizer(ev: &Eval, path: &str, args: &Args) -> Result<Value, CellError> {
    let name = path
        .rsplit('.')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let momentum = args.kw("momentum").and_then(Value::float).unwrap_or(0.0) > 0.0;
    // bitsandbytes' 8-bit optimizers: `bnb.optim.Adam8bit`, ...
    let (name, bits) = match name.strip_suffix("8bit") {
        Some(base) if path.starts_with("bnb.") => (base, 8),
        _ => (name.as_str(), STATE_BITS),
    };
    let kind = match name {
        "sgd" if momentum => OptimizerKind::Momentum,
        "sgd" => OptimizerKind::Sgd,
        "adam" => OptimizerKind::Adam,
        "adamw" => OptimizerKind::Adamw,
        _ => {
            return Err(ev.err(format!(
                "`{path}`: the cell knows SGD (with or without momentum), Adam and AdamW, and bitsandbytes' SGD8bit, Adam8bit and AdamW8bit"
            )))
        }
    };
    let spec = OptimizerSpec::new(kind, bits).map_err(|e| ev.err(format!("`{path}`: {e}")))?;
    let lr = args
        .kw("lr")
        .or(args.kw("learning_rate"))
        .and_then(Value::float)
        .map(|f| f as f32);
    let model = match args.pos.first() {
        Some(Value::Params(model)) => Some(model.clone()),
        _ => None,
    };
    Ok(Value::Optimizer(spec, lr, model))
}

fn dataset(ev: &Eval, args: &Args) -> Result<Value, CellError> {
    let (Some(Value::Tensor(x)), Some(Value::Tensor(_))) = (args.pos.first(), args.pos.get(1))
    else {
        return Err(ev.err("TensorDataset(X, y) takes the inputs and the labels, made in the cell"));
    };
    let (samples, features) = samples_features(ev, &x.shape)?;
    Ok(Value::Dataset(samples, features, x.gpu))
}

pub fn samples_features(ev: &Eval, shape: &[u64]) -> Result<(u64, u64), CellError> {
    match shape.split_first() {
        Some((&n, rest)) if !rest.is_empty() => Ok((n, rest.iter().product())),
        _ => Err(ev.err("the inputs must be samples × features")),
    }
}

fn loader(ev: &Eval, args: &Args) -> Result<Value, CellError> {
    let Some(Value::Dataset(samples, features, on_device)) = args.pos.first() else {
        return Err(ev.err("DataLoader takes a TensorDataset made in the cell"));
    };
    let batch = match args.get(1, "batch_size") {
        None => 1,
        some => whole(ev, some, "batch_size")?,
    };
    Ok(Value::Loader(Loader {
        samples: *samples,
        features: *features,
        batch,
        on_device: *on_device,
    }))
}

fn loss_of(ev: &Eval, args: &Args) -> Result<Value, CellError> {
    match args.pos.first() {
        Some(Value::Forward(f)) => Ok(Value::Forward(Forward {
            loss: true,
            ..f.clone()
        })),
        _ => Err(ev.err("a loss takes the model's output: criterion(model(x), y)")),
    }
}

fn checkpointed(ev: &Eval, args: &Args) -> Result<Value, CellError> {
    match (args.pos.first(), args.pos.get(2)) {
        (Some(Value::Object(model)), Some(Value::Batch(loader))) => Ok(Value::Forward(Forward {
            model: model.clone(),
            loader: loader.clone(),
            checkpointing: true,
            loss: false,
        })),
        _ => Err(ev.err("checkpoint_sequential(model, segments, x) takes the model and a batch")),
    }
}

fn to_gpu(ev: &Eval, v: Value) -> Result<Value, CellError> {
    match v {
        Value::Tensor(t) => Ok(Value::Tensor(TensorInfo { gpu: true, ..t })),
        Value::Object(n) => Ok(Value::Object(n)),
        other => Err(ev.err(format!("cannot put {} on the GPU", other.describe()))),
    }
}

/// `keras.datasets.mnist.load_data()`: host arrays, as NumPy gives them.
fn load_data(ev: &Eval, path: &str) -> Result<Value, CellError> {
    let name = path.split('.').nth(2).unwrap_or_default();
    let (_, [h, w, c]) = DATASETS.iter().find(|(n, _)| *n == name).ok_or_else(|| {
        ev.err(format!(
            "the cell knows mnist, fashion_mnist and cifar10, not {name}"
        ))
    })?;
    let images = |n: u64| {
        let mut shape = vec![n, *h, *w];
        if *c > 1 {
            shape.push(*c);
        }
        Value::Tensor(TensorInfo {
            shape,
            dtype: Dtype::Uint8,
            gpu: false,
        })
    };
    let labels = |n: u64| {
        Value::Tensor(TensorInfo {
            shape: vec![n],
            dtype: Dtype::Uint8,
            gpu: false,
        })
    };
    let train = if name == "cifar10" { 50_000 } else { 60_000 };
    Ok(Value::Tuple(vec![
        Value::Tuple(vec![images(train), labels(train)]),
        Value::Tuple(vec![images(10_000), labels(10_000)]),
    ]))
}

/// A constant by its path: `torch.float16`, `tf.bfloat16`, `jnp.float32`.
pub fn constant(path: &str) -> Option<Value> {
    let (module, name) = path.rsplit_once('.')?;
    matches!(module, "torch" | "tf" | "jnp" | "np")
        .then(|| dtype_named(name))
        .flatten()
        .map(Value::Dtype)
}

//! Operators, attributes and calls on values: arithmetic on numbers,
//! element-wise arithmetic on tensors (a new tensor of the same shape),
//! and methods (`x.cuda()`, `loss.backward()`, `opt.step()`,
//! `h.append(x)`, `model.compile(...)`, `model.fit(...)`).

use super::scope::Eval;
use super::value::{Args, Forward, TensorInfo, Value};
use super::CellError;
use crate::command::*;
use crate::types::Dtype;

pub fn unary(ev: &Eval, op: &str, v: Value) -> Result<Value, CellError> {
    Ok(match (op, v) {
        ("-", Value::Int(i)) => Value::Int(-i),
        ("-", Value::Float(f)) => Value::Float(-f),
        ("+", v @ (Value::Int(_) | Value::Float(_))) => v,
        ("not", v) => v.int().map_or(Value::Opaque, |i| Value::Bool(i == 0)),
        (op, v) => {
            return Err(ev.err(format!(
                "`{op}` on {} is not supported in the cell",
                v.describe()
            )))
        }
    })
}

pub fn binary(ev: &Eval, a: Value, op: &str, b: Value) -> Result<Value, CellError> {
    if let (Some(x), Some(y)) = (a.int(), b.int()) {
        return integers(ev, x, op, y);
    }
    if let (Some(x), Some(y)) = (a.float(), b.float()) {
        return Ok(floats(x, op, y));
    }
    match (a, op, b) {
        (Value::List(x), "+", Value::List(y)) => Ok(Value::List([x, y].concat())),
        // `loss / k` scales the loss; what it keeps alive is the same.
        (Value::Forward(f), "/", _) if f.loss => Ok(Value::Forward(f)),
        (_, "@", _) => Err(ev.err(
            "`@` is not in the cell's Python: a bare matmul's cuBLAS workspace is only modelled inside training",
        )),
        (a, op @ ("+" | "-" | "*" | "/"), b) => elementwise(ev, &a, op, &b),
        _ => Ok(Value::Opaque),
    }
}

fn integers(ev: &Eval, x: i128, op: &str, y: i128) -> Result<Value, CellError> {
    let overflow = || ev.err("that number is too large");
    Ok(match op {
        "+" => Value::Int(x.checked_add(y).ok_or_else(overflow)?),
        "-" => Value::Int(x.checked_sub(y).ok_or_else(overflow)?),
        "*" => Value::Int(x.checked_mul(y).ok_or_else(overflow)?),
        "**" => {
            let e = u32::try_from(y).map_err(|_| overflow())?;
            Value::Int(x.checked_pow(e).ok_or_else(overflow)?)
        }
        "//" | "%" if y == 0 => {
            return Err(ev.err("ZeroDivisionError: integer division or modulo by zero"))
        }
        "//" => Value::Int(x.div_euclid(y)),
        "%" => Value::Int(x.rem_euclid(y)),
        _ => floats(x as f64, op, y as f64),
    })
}

fn floats(x: f64, op: &str, y: f64) -> Value {
    match op {
        "+" => Value::Float(x + y),
        "-" => Value::Float(x - y),
        "*" => Value::Float(x * y),
        "/" => Value::Float(x / y),
        "**" => Value::Float(x.powf(y)),
        "==" => Value::Bool(x == y),
        "!=" => Value::Bool(x != y),
        "<" => Value::Bool(x < y),
        ">" => Value::Bool(x > y),
        "<=" => Value::Bool(x <= y),
        ">=" => Value::Bool(x >= y),
        _ => Value::Opaque,
    }
}

/// The tensor a value is (new or in the kernel), if the cell knows its shape.
fn tensor_of(ev: &Eval, v: &Value) -> Option<TensorInfo> {
    match v {
        Value::Tensor(t) => Some(t.clone()),
        Value::Object(n) => ev.names.tensor(n).cloned(),
        _ => None,
    }
}

/// `x + 1`, `x * y`, `x_train / 255.0`: a new tensor of the tensor's shape.
fn elementwise(ev: &Eval, a: &Value, op: &str, b: &Value) -> Result<Value, CellError> {
    let (ta, tb) = (tensor_of(ev, a), tensor_of(ev, b));
    let t =
        match (ta, tb) {
            (Some(x), Some(y)) if x.shape != y.shape => return Err(ev.err(
                "element-wise arithmetic in the cell needs tensors of one shape (no broadcasting)",
            )),
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) => return Ok(Value::Opaque),
        };
    let scalar_float = a.float().or(b.float()).is_some_and(|f| f.fract() != 0.0) || op == "/";
    let float = matches!(
        t.dtype,
        Dtype::Float64 | Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16
    );
    let dtype = if scalar_float && !float {
        Dtype::Float32
    } else {
        t.dtype
    };
    Ok(Value::Tensor(TensorInfo { dtype, ..t }))
}

pub fn attribute(_ev: &Eval, v: Value, attr: &str) -> Result<Value, CellError> {
    Ok(Value::Method(Box::new(v), attr.to_string()))
}

pub fn call_value(ev: &Eval, callee: Value, args: &Args) -> Result<Value, CellError> {
    let first = args.pos.first().cloned().unwrap_or(Value::None);
    match (callee, first) {
        (Value::Method(recv, m), _) => method(ev, *recv, &m, args),
        (Value::Object(model), Value::Batch(loader)) => Ok(Value::Forward(Forward {
            model,
            loader,
            checkpointing: false,
            loss: false,
        })),
        (Value::Object(model), _) => Err(ev.err(format!(
            "the cell runs `{model}(x)` on a batch from a DataLoader: `x, y = next(iter(loader))`"
        ))),
        (Value::Criterion, Value::Forward(f)) => Ok(Value::Forward(Forward { loss: true, ..f })),
        // `loss = criterion(out, y)`: the loss keeps `out`'s graph.
        (Value::Criterion, Value::Object(out)) => Ok(Value::Object(out)),
        (callee, _) => Err(ev.err(format!(
            "{} is not something the cell can call",
            callee.describe()
        ))),
    }
}

fn method(ev: &Eval, recv: Value, m: &str, args: &Args) -> Result<Value, CellError> {
    match recv {
        Value::Tensor(t) => tensor_method(ev, t, m, args),
        Value::Object(n) => object_method(ev, n, m, args),
        Value::Model(mut a) => {
            if let Some(d) = cast(m, args) {
                a.dtype = Some(d);
            }
            Ok(Value::Model(a))
        }
        Value::Batch(l) => Ok(Value::Batch(l)),
        other => Err(ev.err(format!(
            "`.{m}(...)` on {} is not in the cell's Python",
            other.describe()
        ))),
    }
}

/// The dtype a cast method asks for: `.half()`, `.to(torch.bfloat16)`, `.astype("float32")`.
fn cast(m: &str, args: &Args) -> Option<Dtype> {
    match m {
        "half" => Some(Dtype::Float16),
        "float" => Some(Dtype::Float32),
        "double" => Some(Dtype::Float64),
        "bfloat16" => Some(Dtype::Bfloat16),
        "to" | "astype" | "type" => args
            .pos
            .iter()
            .chain(args.kw.iter().map(|(_, v)| v))
            .find_map(|v| match v {
                Value::Dtype(d) => Some(*d),
                Value::Str(s) => super::value::dtype_named(s),
                _ => None,
            }),
        _ => None,
    }
}

/// Where `.to(...)`, `.cuda()`, `.cpu()` send a tensor; `None` when they keep it.
fn moves(m: &str, args: &Args) -> Option<bool> {
    match m {
        "cuda" => Some(true),
        "cpu" | "numpy" | "tolist" => Some(false),
        "to" => args
            .pos
            .iter()
            .chain(args.kw.iter().map(|(_, v)| v))
            .find_map(|v| match v {
                Value::Device(gpu) => Some(*gpu),
                Value::Str(s) if super::value::dtype_named(s).is_none() => {
                    Some(super::value::is_cuda(s))
                }
                _ => None,
            }),
        _ => None,
    }
}

fn tensor_method(ev: &Eval, t: TensorInfo, m: &str, args: &Args) -> Result<Value, CellError> {
    if m == "item" {
        return Ok(Value::Float(0.0));
    }
    let gpu = moves(m, args).unwrap_or(t.gpu);
    let dtype = cast(m, args).unwrap_or(t.dtype);
    let shape = match m {
        "reshape" | "view" => reshaped(ev, &t.shape, args)?,
        "flatten" => vec![t.shape.iter().product()],
        _ => t.shape,
    };
    Ok(Value::Tensor(TensorInfo { shape, dtype, gpu }))
}

fn reshaped(ev: &Eval, shape: &[u64], args: &Args) -> Result<Vec<u64>, CellError> {
    let dims: Vec<i128> = match args.pos.as_slice() {
        [Value::Tuple(d) | Value::List(d)] => d.iter().filter_map(Value::int).collect(),
        d => d.iter().filter_map(Value::int).collect(),
    };
    let total: u64 = shape.iter().product();
    let known: i128 = dims.iter().filter(|&&d| d != -1).product();
    let bad = || {
        ev.err("reshape takes whole numbers (one of them may be -1) whose product is the tensor's size")
    };
    let out: Vec<u64> = dims
        .iter()
        .map(|&d| {
            if d == -1 {
                i128::from(total) / known.max(1)
            } else {
                d
            }
        })
        .map(|d| u64::try_from(d).map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    if out.iter().product::<u64>() != total {
        return Err(bad());
    }
    Ok(out)
}

fn object_method(ev: &Eval, n: String, m: &str, args: &Args) -> Result<Value, CellError> {
    if let Some(t) = ev.names.tensor(&n) {
        return kernel_tensor_method(ev, n.clone(), t.clone(), m, args);
    }
    if ev.names.keras(&n).is_some() && matches!(m, "compile" | "fit") {
        return super::keras::method(ev, &n, m, args);
    }
    let effect = |c: Command| Ok(Value::Effect(vec![c]));
    match m {
        "backward" => effect(Command::Backward(BackwardArgs {
            name: n,
            retain_graph: args
                .kw("retain_graph")
                .and_then(Value::int)
                .is_some_and(|i| i != 0),
        })),
        "step" => effect(Command::Step(StepArgs { optimizer: n })),
        "zero_grad" => effect(Command::ZeroGrad(ZeroGradArgs {
            optimizer: n,
            set_to_none: args
                .get(0, "set_to_none")
                .and_then(Value::int)
                .is_none_or(|i| i != 0),
        })),
        "close" => effect(Command::Close(NameArgs { name: n })),
        "append" => append(ev, n, args),
        "parameters" => Ok(Value::Params(n)),
        "item" => Ok(Value::Float(0.0)),
        "cuda" | "to" | "train" | "eval" | "build" | "summary" => Ok(Value::Object(n)),
        _ => Err(ev.err(format!("`{n}.{m}(...)` is not in the cell's Python"))),
    }
}

fn append(ev: &Eval, list: String, args: &Args) -> Result<Value, CellError> {
    match args.pos.first() {
        Some(Value::Object(item)) => Ok(Value::Effect(vec![Command::Append(AppendArgs {
            name: list,
            item: item.clone(),
        })])),
        // A Python number holds no GPU memory.
        Some(Value::Float(_) | Value::Int(_)) => Ok(Value::None),
        _ => Err(ev.err(
            "append a name to a list in the cell: `t = torch.zeros(...)`, then `h.append(t)`",
        )),
    }
}

/// Methods of a kernel tensor the cell made: a view or a move to where it
/// already is shares its storage; a cast or a copy is a new tensor.
fn kernel_tensor_method(
    ev: &Eval,
    n: String,
    t: TensorInfo,
    m: &str,
    args: &Args,
) -> Result<Value, CellError> {
    let same =
        moves(m, args).is_none_or(|gpu| gpu == t.gpu) && cast(m, args).is_none_or(|d| d == t.dtype);
    match m {
        "detach" | "contiguous" | "view" | "reshape" | "cuda" | "to" | "half" | "float"
        | "bfloat16"
            if same =>
        {
            Ok(Value::Object(n))
        }
        "append" => append(ev, n, args),
        _ => tensor_method(ev, t, m, args),
    }
}

//! The Python a command adds to the code cell: code CPython runs with
//! vramlab's shims, so "Run all" runs the same commands again. Where the
//! code pane may abbreviate (`next(batches)`, `criterion`), the cell's
//! code makes every name it reads: the batch is a slice of the dataset
//! (`x, y = data[:64]`), the loss `torch.nn.functional.cross_entropy`, a
//! training loop a `for` over its steps. Appended to a cell, it brings the
//! framework's imports and the names it adds to (`total_loss`, `losses`)
//! when the cell has none yet.

use super::{code, model_code, optimizer_code, py_bool};
use crate::command::*;
use crate::types::Framework;

/// The line a control's command adds to the code cell (see the module).
pub fn cell_code(cmd: &Command, framework: Framework) -> String {
    match (cmd, framework) {
        (Command::Model(a), _) => model_code(a, framework),
        (Command::Optimizer(a), _) => optimizer_code(a),
        (Command::Data(a), _) => data_code(a),
        (Command::Forward(a), Framework::Pytorch) => forward_code(a),
        (Command::Train(a), _) => train_code(a),
        _ => code(cmd, framework),
    }
}

/// The imports a framework's cell starts with.
pub fn imports(framework: Framework) -> &'static str {
    match framework {
        Framework::Pytorch => {
            "import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n"
        }
        Framework::Tensorflow => "import numpy as np\nimport tensorflow as tf\n",
        Framework::Jax => "import numpy as np\nimport jax\nimport jax.numpy as jnp\nimport optax\n",
    }
}

/// What appending `cmd` to a cell whose text is `source` adds: the
/// imports when the cell has none, a start value for a name the code adds
/// to and the cell never set, then the code.
pub fn append(source: &str, cmd: &Command, framework: Framework) -> String {
    let code = cell_code(cmd, framework);
    let mut out = String::new();
    if !source.lines().any(|l| l.starts_with("import ")) {
        out.push_str(imports(framework));
    }
    for (name, start) in [("total_loss", "0.0"), ("losses", "[]")] {
        let reads =
            code.contains(&format!("{name} +=")) || code.contains(&format!("{name}.append"));
        if reads && !assigns(source, name) {
            out.push_str(&format!("{name} = {start}\n"));
        }
    }
    out.push_str(&code);
    out
}

/// Whether a line of `source` binds `name` (`name = ...` at its start).
fn assigns(source: &str, name: &str) -> bool {
    source
        .lines()
        .any(|l| l.trim_start().starts_with(&format!("{name} = ")))
}

/// The samples: on the host, or all on the GPU.
fn data_code(a: &DataArgs) -> String {
    let (name, s, f, c) = (&a.name, a.samples, a.features, a.classes);
    match a.on_device {
        true => format!(
            "{name} = TensorDataset(torch.randn({s}, {f}, device=\"cuda\"), torch.randint(0, {c}, ({s},), device=\"cuda\"))  # all on the GPU"
        ),
        false => format!(
            "{name} = TensorDataset(torch.randn({s}, {f}), torch.randint(0, {c}, ({s},)))  # on the host"
        ),
    }
}

/// Wraps `body` (one statement per line) in `with` blocks for autocast
/// and `no_grad`, at `indent`.
fn within(body: &[String], amp: Amp, no_grad: bool, indent: &str) -> String {
    let mut out = String::new();
    let mut inner = indent.to_string();
    if no_grad {
        out.push_str(&format!("{inner}with torch.no_grad():\n"));
        inner.push_str("    ");
    }
    if amp.is_on() {
        let dtype = amp.torch_dtype();
        out.push_str(&format!(
            "{inner}with torch.autocast(\"cuda\", dtype={dtype}):\n"
        ));
        inner.push_str("    ");
    }
    for line in body {
        out.push_str(&format!("{inner}{line}\n"));
    }
    out
}

/// `model(x)` on `x` (`x.cuda()`: a copy that dies with the statement),
/// or checkpointed as `torch.utils.checkpoint` runs it.
fn output(model: &str, x: &str, checkpointing: bool) -> String {
    match checkpointing {
        true => format!(
            "torch.utils.checkpoint.checkpoint_sequential({model}, 4, {x}, use_reentrant=False)"
        ),
        false => format!("{model}({x})"),
    }
}

fn checkpoint_import(checkpointing: bool) -> String {
    match checkpointing {
        true => "import torch.utils.checkpoint\n".into(),
        false => String::new(),
    }
}

fn forward_code(a: &ForwardArgs) -> String {
    // Its own names for the batch: a training loop's `x, y` stay bound.
    let loss = format!(
        "{} = torch.nn.functional.cross_entropy({}, targets.cuda())",
        a.name,
        output(&a.model, "inputs.cuda()", a.checkpointing)
    );
    let mut s = checkpoint_import(a.checkpointing);
    s.push_str(&format!(
        "inputs, targets = {}[:{}]\n",
        a.data, a.batch_size
    ));
    s.push_str(&within(&[loss], a.amp, a.no_grad, ""));
    s.trim_end().to_string()
}

fn train_code(a: &TrainArgs) -> String {
    let (micro, accumulate) = (a.batch_size / a.accumulate.max(1), a.accumulate.max(1));
    let mut s = checkpoint_import(a.checkpointing);
    s.push_str(&format!("for step in range({}):\n", a.steps));
    let indent = match accumulate {
        1 => "    ",
        _ => {
            s.push_str(&format!("    for micro in range({accumulate}):\n"));
            "        "
        }
    };
    // The loop's names outlive it: the last batch stays on the GPU.
    s.push_str(&format!("{indent}x, y = {}[:{micro}]\n", a.data));
    s.push_str(&format!("{indent}x, y = x.cuda(), y.cuda()\n"));
    let divided = match accumulate {
        1 => String::new(),
        n => format!(" / {n}"),
    };
    let loss = format!(
        "loss = torch.nn.functional.cross_entropy({}, y){divided}",
        output(&a.model, "x", a.checkpointing)
    );
    s.push_str(&within(&[loss], a.amp, false, indent));
    s.push_str(&format!("{indent}loss.backward()\n"));
    s.push_str(&format!(
        "{indent}{}\n",
        match a.loss_history {
            LossHistory::Item => "last_loss = loss.item()",
            LossHistory::Tensor =>
                "total_loss += loss  # one scalar on the GPU; its history is host memory",
            LossHistory::List => "losses.append(loss)  # every step's loss stays",
        }
    ));
    s.push_str(&format!(
        "    {0}.step()\n    {0}.zero_grad(set_to_none={1})",
        a.optimizer,
        py_bool(a.set_to_none)
    ));
    s
}

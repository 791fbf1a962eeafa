//! The Python a command adds to the code cell: code CPython runs with
//! vramlab's shims, so "Run all" runs the same commands again. Where the
//! code pane may abbreviate (`next(batches)`, `criterion`), the cell's
//! code makes every name it reads: the batch is a slice of the dataset
//! (`x, y = data[:64]`), the loss `torch.nn.functional.cross_entropy`, a
//! training loop a `for` over its steps, a GPT or CNN vramlab's own
//! (`vramlab.models`). Appended to a cell, it fits what the cell has: the
//! framework's imports it lacks, a start value for the names it
//! adds to (`total_loss`, `losses`), token or image datasets for the
//! networks it built, a GPT's attention switched where a step asks.

mod context;
mod hf;

use super::{code, kind_code, model_code, optimizer_code, py_bool};
use crate::command::*;
use crate::train::kinds::Attention;
use crate::types::Framework;
use context::{Context, Net};

/// The line a control's command adds to an empty code cell (see the
/// module); [`append`] fits it to a cell's code.
pub fn cell_code(cmd: &Command, framework: Framework) -> String {
    code_in(&Context::default(), cmd, framework)
}

/// The Python a command stands for after `source` (the code pane's lines
/// so far): [`super::code`], with PyTorch's data, batches and losses
/// fitted to the networks that code built.
pub fn code_after(source: &str, cmd: &Command, framework: Framework) -> String {
    match (cmd, framework) {
        (Command::Generate(a), _) => super::generate_code(a, eager_before(source, &a.model)),
        (Command::Data(_) | Command::Forward(_) | Command::Train(_), Framework::Pytorch) => {
            code_in(&Context::read(source), cmd, framework)
        }
        _ => code(cmd, framework),
    }
}

fn code_in(c: &Context, cmd: &Command, framework: Framework) -> String {
    use Framework::{Pytorch, Tensorflow};
    match (cmd, framework) {
        (Command::Model(a), Pytorch) => torch_model_code(a),
        (Command::Model(a), Tensorflow) => model_code(a, framework),
        (Command::Optimizer(a), Pytorch) => optimizer_code(a),
        (Command::Data(a), Pytorch) => data_code(c, a),
        (Command::Data(a), _) => numpy_data_code(a),
        (Command::Forward(a), Pytorch) if c.hf(&a.model) => hf::forward_code(c, a),
        (Command::Forward(a), Pytorch) => forward_code(c, a),
        (Command::Forward(a), Tensorflow) => keras_forward_code(a),
        (Command::Train(a), Pytorch) if c.hf(&a.model) => hf::train_code(c, a),
        (Command::Train(a), Pytorch) => train_code(c, a),
        _ => code(cmd, framework),
    }
}

/// Keras's and JAX's samples: numpy arrays on the host.
fn numpy_data_code(a: &DataArgs) -> String {
    format!(
        "x_train, y_train = np.random.rand({0}, {1}).astype(\"float32\"), np.random.randint(0, {2}, {0})  # on the host",
        a.samples, a.features, a.classes
    )
}

/// A Keras model's loss on a batch, under a `GradientTape` unless
/// `no_grad` (the tape's gradients come from `tape.gradient`).
fn keras_forward_code(a: &ForwardArgs) -> String {
    let (name, model) = (&a.name, &a.model);
    let loss = "tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)";
    let batch = format!("x, y = x_train[:{0}], y_train[:{0}]\n", a.batch_size);
    match a.no_grad {
        true => format!("{batch}{name} = {loss}(y, {model}(x, training=False))"),
        false => format!(
            "{batch}with tf.GradientTape() as tape:\n    {name} = {loss}(y, {model}(x, training=True))"
        ),
    }
}

/// The imports a framework's cell starts with.
pub fn imports(framework: Framework) -> &'static str {
    match framework {
        Framework::Pytorch => {
            "import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n"
        }
        Framework::Tensorflow => "import numpy as np\nimport tensorflow as tf\n",
        Framework::Jax => "import numpy as np\nimport jax\nimport jax.numpy as jnp\n",
    }
}

/// What appending `cmd` to a cell whose text is `source` adds: the
/// framework's imports when the cell has none, else those the code reads
/// and the cell lacks; a start value for a name the code adds
/// to and the cell never set, then the code, fitted to the cell.
pub fn append(source: &str, cmd: &Command, framework: Framework) -> String {
    let code = match cmd {
        Command::Generate(a) => super::generate_code(a, eager_before(source, &a.model)),
        _ => code_in(&Context::read(source), cmd, framework),
    };
    let mut out = String::new();
    if !source.lines().any(|l| l.starts_with("import ")) {
        out.push_str(imports(framework));
    } else {
        // The imports the code reads that the cell lacks (pasted code that
        // starts with `import torch` has no `nn`).
        for import in imports(framework).lines() {
            let bound = import.rsplit(' ').next().unwrap_or_default();
            let reads = code.contains(&format!("{bound}.")) || code.contains(&format!("{bound}("));
            if reads && !source.lines().any(|l| l.trim_end() == import) {
                out.push_str(import);
                out.push('\n');
            }
        }
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

/// Whether `model`'s attention was last switched to eager in `source`
/// (a later `generate` with sdpa switches it back).
fn eager_before(source: &str, model: &str) -> bool {
    let set = format!("{model}.set_attn_implementation(");
    source
        .lines()
        .rev()
        .find_map(|l| l.trim_start().strip_prefix(&set))
        .is_some_and(|rest| rest.starts_with("\"eager\""))
}

/// Whether a line of `source` binds `name` (`name = ...` at its start).
fn assigns(source: &str, name: &str) -> bool {
    source
        .lines()
        .any(|l| l.trim_start().starts_with(&format!("{name} = ")))
}

/// vramlab's GPT or CNN from its module; LoRA as peft adds it, to the
/// model still on the host.
fn torch_model_code(a: &ModelArgs) -> String {
    let Some(built) = kind_code(a) else {
        return model_code(a, Framework::Pytorch);
    };
    let class = match a.kind {
        ModelKind::Cnn => "CNN",
        _ => "GPT",
    };
    let mut s = format!("from vramlab.models import {class}\n");
    match a.lora_rank.filter(|&r| r > 0) {
        Some(r) => {
            let gpt = built
                .split_once(" = get_peft_model(")
                .map_or("", |(_, rest)| rest);
            let gpt = gpt.split_once(".cuda(), ").map_or(gpt, |(g, _)| g);
            s.push_str("from peft import LoraConfig, get_peft_model\n");
            s.push_str(&format!(
                "{} = get_peft_model({gpt}, LoraConfig(r={r}, target_modules=\"all-linear\")).cuda()  # adapters on every block's linear layers; the rest frozen",
                a.name
            ));
        }
        None => s.push_str(&built),
    }
    s
}

/// The samples, on the host or all on the GPU: token ids for a GPT the
/// cell built, images for a CNN, else rows of features.
fn data_code(c: &Context, a: &DataArgs) -> String {
    let (name, s, f, k) = (&a.name, a.samples, a.features, a.classes);
    let on = match a.on_device {
        true => ", device=\"cuda\"",
        false => "",
    };
    let where_ = match a.on_device {
        true => "all on the GPU",
        false => "on the host",
    };
    match c.fed(f, k) {
        Some(Net::Gpt { seq_len: t, vocab: v }) => format!(
            "{name} = TensorDataset(torch.randint(0, {v}, ({s}, {t}){on}), torch.randint(0, {v}, ({s}, {t}){on}))  # token ids and the next ones, {where_}"
        ),
        Some(Net::Cnn { channels: ch, image_size: px }) => format!(
            "{name} = TensorDataset(torch.randn({s}, {ch}, {px}, {px}{on}), torch.randint(0, {k}, ({s},){on}))  # images and labels, {where_}"
        ),
        Some(Net::Hf) => hf::data_code(a),
        None => format!(
            "{name} = TensorDataset(torch.randn({s}, {f}{on}), torch.randint(0, {k}, ({s},){on}))  # {where_}"
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

/// The loss of `model` on `x` and `y` (`x.cuda()`: a copy that dies with
/// the statement), an MLP's checkpointed as `checkpoint_sequential` runs
/// it (a GPT or a CNN checkpoints its blocks itself, once enabled); a
/// GPT's over every token.
fn loss_expr(c: &Context, model: &str, (x, y): (&str, &str), checkpointing: bool) -> String {
    let out = match checkpointing && c.net(model).is_none() {
        true => format!(
            "torch.utils.checkpoint.checkpoint_sequential({model}, 4, {x}, use_reentrant=False)"
        ),
        false => format!("{model}({x})"),
    };
    match c.net(model) {
        Some(Net::Gpt { .. }) => {
            format!("torch.nn.functional.cross_entropy({out}.flatten(0, 1), {y}.flatten())")
        }
        _ => format!("torch.nn.functional.cross_entropy({out}, {y})"),
    }
}

/// The lines before a step: an MLP's checkpoint module, a GPT's or a
/// CNN's checkpointing switched as transformers switches it, and a GPT's
/// attention where the step asks for another (methods a PeftModel passes
/// on to the model it wraps).
fn setup(c: &Context, model: &str, checkpointing: bool, attention: Attention) -> String {
    let mut s = String::new();
    match c.net(model) {
        None if checkpointing => s.push_str("import torch.utils.checkpoint\n"),
        Some(_) if checkpointing != c.checkpointing(model) => {
            let on = if checkpointing { "enable" } else { "disable" };
            s.push_str(&format!("{model}.gradient_checkpointing_{on}()\n"));
        }
        _ => {}
    }
    let wanted = match attention {
        Attention::Eager => "eager",
        Attention::Sdpa => "sdpa",
    };
    if matches!(c.net(model), Some(Net::Gpt { .. })) && c.attention(model) != wanted {
        s.push_str(&format!("{model}.set_attn_implementation(\"{wanted}\")\n"));
    }
    s
}

fn forward_code(c: &Context, a: &ForwardArgs) -> String {
    // Its own names for the batch: a training loop's `x, y` stay bound.
    let loss = format!(
        "{} = {}",
        a.name,
        loss_expr(
            c,
            &a.model,
            ("inputs.cuda()", "targets.cuda()"),
            a.checkpointing
        )
    );
    let mut s = setup(c, &a.model, a.checkpointing, a.attention);
    s.push_str(&format!(
        "inputs, targets = {}[:{}]\n",
        a.data, a.batch_size
    ));
    s.push_str(&within(&[loss], a.amp, a.no_grad, ""));
    s.trim_end().to_string()
}

fn train_code(c: &Context, a: &TrainArgs) -> String {
    let accumulate = a.accumulate.max(1);
    let micro = a.batch_size / accumulate;
    let mut s = setup(c, &a.model, a.checkpointing, a.attention);
    s.push_str(&format!("for step in range({}):\n", a.steps));
    let indent = match accumulate {
        1 => "    ",
        _ => {
            s.push_str(&format!("    for micro in range({accumulate}):\n"));
            "        "
        }
    };
    // The new batch is copied in, then `x, y` let go of the last one;
    // they outlive the loop, the last batch still on the GPU.
    s.push_str(&format!("{indent}inputs, targets = {}[:{micro}]\n", a.data));
    s.push_str(&format!("{indent}x, y = inputs.cuda(), targets.cuda()\n"));
    let divided = match accumulate {
        1 => String::new(),
        n => format!(" / {n}"),
    };
    let loss = format!(
        "loss = {}{divided}",
        loss_expr(c, &a.model, ("x", "y"), a.checkpointing)
    );
    s.push_str(&within(&[loss], a.amp, false, indent));
    s.push_str(&format!("{indent}loss.backward()\n"));
    s.push_str(&format!(
        "{indent}{}\n",
        match a.loss_history {
            LossHistory::Item => "total_loss += loss.item()",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::parse_line;

    fn command(line: &str) -> Command {
        parse_line(line).command.unwrap()
    }

    /// Pasted code that starts with `import torch` gets the imports the
    /// button's line reads and the cell lacks (`nn` here), and only those.
    #[test]
    fn a_button_adds_the_imports_the_cell_lacks() {
        let model = command(r#"{"cmd":"model","name":"model","layers":2,"width":64}"#);
        let pasted = "import torch\nx = torch.zeros(4, device=\"cuda\")\n";
        let added = append(pasted, &model, Framework::Pytorch);
        assert!(
            added.starts_with("from torch import nn\nmodel = nn.Sequential("),
            "{added}"
        );
        let all = format!("{}{added}\n", imports(Framework::Pytorch));
        let again = append(&all, &model, Framework::Pytorch);
        assert!(again.starts_with("model = nn.Sequential("), "{again}");
        let keras = append("import numpy as np\n", &model, Framework::Tensorflow);
        assert!(
            keras.starts_with("import tensorflow as tf\nmodel = tf.keras.Sequential("),
            "{keras}"
        );
    }

    /// Appended to a cell: the imports once, `total_loss` set before the
    /// first loop that adds to it, a GPT's tokens and its loss over every
    /// token, its attention switched when a step asks for another.
    #[test]
    fn appended_code_fits_the_cell() {
        let f = Framework::Pytorch;
        let gpt = command(
            r#"{"cmd":"model","name":"m","kind":"transformer","layers":2,"width":64,"heads":2,"seq_len":128,"vocab":1000}"#,
        );
        let mut cell = append("", &gpt, f);
        assert!(cell.starts_with("import torch\n"), "{cell}");
        assert!(
            cell.contains("from vramlab.models import GPT\nm = GPT(layers=2"),
            "{cell}"
        );
        cell.push('\n');
        let data =
            command(r#"{"cmd":"data","name":"d","samples":100,"features":128,"classes":1000}"#);
        let added = append(&cell, &data, f);
        assert_eq!(added, "d = TensorDataset(torch.randint(0, 1000, (100, 128)), torch.randint(0, 1000, (100, 128)))  # token ids and the next ones, on the host");
        cell.push_str(&added);
        cell.push('\n');
        let train = command(
            r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","steps":3,"batch_size":4,"attention":"sdpa","loss_history":"tensor"}"#,
        );
        let added = append(&cell, &train, f);
        assert!(!added.contains("import torch\n"), "{added}");
        assert!(
            added.starts_with("total_loss = 0.0\nm.set_attn_implementation(\"sdpa\")"),
            "{added}"
        );
        assert!(
            added.contains(
                "loss = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())"
            ),
            "{added}"
        );
        cell.push_str(&added);
        cell.push('\n');
        let again = append(&cell, &train, f);
        assert!(again.starts_with("for step in range(3):"), "{again}");
        // An MLP's rows of features, and its loss as it is.
        let rows = append(
            "import torch\n",
            &command(r#"{"cmd":"data","name":"d","on_device":true}"#),
            f,
        );
        assert!(
            rows.starts_with("from torch.utils.data import TensorDataset\nd = TensorDataset(torch.randn(60000, 784, device=\"cuda\")"),
            "{rows}"
        );
    }

    /// A Hugging Face model's steps are transformers' code: training mode
    /// first (`from_pretrained` leaves eval mode, where nothing is
    /// checkpointed), the loss its forward computes from `labels`, the
    /// checkpointing peft turned on left on.
    #[test]
    fn a_hugging_face_models_steps_are_transformers_code() {
        let f = Framework::Pytorch;
        let mut cell = String::new();
        for line in [
            r#"{"cmd":"model","name":"m","kind":"hf","config":"meta-llama/Llama-3.2-1B","quantization":"nf4","dtype":"bfloat16"}"#,
            r#"{"cmd":"prepare_kbit","model":"m"}"#,
            r#"{"cmd":"lora","model":"m","rank":8,"all_linear":true}"#,
            r#"{"cmd":"optimizer","name":"opt","model":"m","kind":"adamw"}"#,
            r#"{"cmd":"data","name":"data","samples":8,"features":512,"classes":128256}"#,
        ] {
            cell.push_str(&append(&cell, &command(line), f));
            cell.push('\n');
        }
        assert!(
            cell.contains("torch.randint(0, 128256, (8, 512))"),
            "{cell}"
        );
        let train = command(
            r#"{"cmd":"train","model":"m","optimizer":"opt","data":"data","steps":2,"batch_size":2,"checkpointing":true,"attention":"sdpa"}"#,
        );
        let code = append(&cell, &train, f);
        assert!(
            code.starts_with("total_loss = 0.0\nm.train()\nfor step in range(2):"),
            "{code}"
        );
        assert!(
            code.contains(
                "    ids = inputs.cuda()\n    loss = m(input_ids=ids, labels=ids).loss\n"
            ),
            "{code}"
        );
        assert!(!code.contains("gradient_checkpointing_enable"), "{code}");
        cell.push_str(&code);
        cell.push('\n');
        let forward = command(
            r#"{"cmd":"forward","name":"loss","model":"m","data":"data","batch_size":1,"batch":["ids","ids"],"attention":"eager"}"#,
        );
        let code = append(&cell, &forward, f);
        assert_eq!(
            code,
            "m.gradient_checkpointing_disable()\nm.set_attn_implementation(\"eager\")\nloss = m(input_ids=ids, labels=ids).loss"
        );
    }
}

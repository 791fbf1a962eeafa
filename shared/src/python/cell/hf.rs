//! A Hugging Face model's steps as transformers' code: the loss its
//! forward computes from `labels` (`model(input_ids=ids, labels=ids).loss`),
//! its checkpointing and attention switched as transformers switches
//! them, a token dataset for it.

use super::context::Context;
use super::within;
use crate::command::{DataArgs, ForwardArgs, LossHistory, TrainArgs};
use crate::train::kinds::Attention;

/// A language model's token dataset: ids and the next ones.
pub(super) fn data_code(a: &DataArgs) -> String {
    let (name, s, t, v) = (&a.name, a.samples, a.features, a.classes);
    let on = if a.on_device { ", device=\"cuda\"" } else { "" };
    format!("{name} = TensorDataset(torch.randint(0, {v}, ({s}, {t}){on}), torch.randint(0, {v}, ({s}, {t}){on}))  # token ids")
}

/// Training mode (`from_pretrained` leaves a model in eval mode, where
/// transformers checkpoints nothing), checkpointing and attention
/// switched where the step asks for others (transformers' defaults: off,
/// and sdpa).
fn setup(c: &Context, model: &str, checkpointing: bool, attention: Attention) -> String {
    let mut s = String::new();
    if !c.training(model) {
        s.push_str(&format!("{model}.train()\n"));
    }
    if checkpointing != c.checkpointing(model) {
        let on = if checkpointing { "enable" } else { "disable" };
        s.push_str(&format!("{model}.gradient_checkpointing_{on}()\n"));
    }
    let wanted = if attention.is_eager() {
        "eager"
    } else {
        "sdpa"
    };
    if c.hf_attention(model) != wanted {
        s.push_str(&format!("{model}.set_attn_implementation(\"{wanted}\")\n"));
    }
    s
}

fn loss_line(name: &str, model: &str, ids: &str, labels: &str) -> String {
    format!("{name} = {model}(input_ids={ids}, labels={labels}).loss")
}

/// `loss = model(input_ids=ids, labels=ids).loss`: on the tensors the
/// code made, or a batch of the dataset copied in as `ids`.
pub(super) fn forward_code(c: &Context, a: &ForwardArgs) -> String {
    let mut s = setup(c, &a.model, a.checkpointing, a.attention);
    let (ids, labels) = match a.batch.as_deref() {
        Some([ids, labels, ..]) => (ids.clone(), labels.clone()),
        Some([ids]) => (ids.clone(), ids.clone()),
        _ => {
            s.push_str(&format!(
                "inputs, targets = {}[:{}]\nids = inputs.cuda()\n",
                a.data, a.batch_size
            ));
            ("ids".to_string(), "ids".to_string())
        }
    };
    s.push_str(&within(
        &[loss_line(&a.name, &a.model, &ids, &labels)],
        a.amp,
        a.no_grad,
        "",
    ));
    s.trim_end().to_string()
}

/// The loop: each step a batch copied in as `ids` (with `accumulate`,
/// that many micro-batches, each one's gradients added into the last's),
/// the loss, `backward()`, `opt.step()`, `zero_grad`.
pub(super) fn train_code(c: &Context, a: &TrainArgs) -> String {
    let accumulate = a.accumulate.max(1);
    let mut s = setup(c, &a.model, a.checkpointing, a.attention);
    s.push_str(&format!("for step in range({}):\n", a.steps));
    let indent = match accumulate {
        1 => "    ",
        n => {
            s.push_str(&format!(
                "    for micro in range({n}):  # each backward adds into the gradients\n"
            ));
            "        "
        }
    };
    s.push_str(&format!(
        "{indent}inputs, targets = {}[:{}]\n{indent}ids = inputs.cuda()\n",
        a.data,
        a.batch_size / accumulate
    ));
    s.push_str(&within(
        &[loss_line("loss", &a.model, "ids", "ids")],
        a.amp,
        false,
        indent,
    ));
    s.push_str(&format!("{indent}loss.backward()\n"));
    s.push_str(indent);
    s.push_str(match a.loss_history {
        LossHistory::Item => "total_loss += loss.item()\n",
        LossHistory::Tensor => "total_loss += loss\n",
        LossHistory::List => "losses.append(loss)\n",
    });
    s.push_str(&format!(
        "    {0}.step()\n    {0}.zero_grad(set_to_none={1})",
        a.optimizer,
        super::py_bool(a.set_to_none)
    ));
    s
}

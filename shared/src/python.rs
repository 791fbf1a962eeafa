//! The Python a command stands for, in the framework chosen (the code pane),
//! and the plain-language account of which of the three numbers moved.

use crate::protocol::{Command, Framework, LossHistory};
use crate::snapshot::Stats;
use crate::units::{format_size, MIB};

fn size_expr(bytes: u64) -> String {
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} * 2**20", bytes / MIB)
    } else {
        bytes.to_string()
    }
}

/// The line(s) of Python a command stands for.
pub fn code(cmd: &Command, framework: Framework) -> String {
    let tf = framework == Framework::Tensorflow;
    let jax = framework == Framework::Jax;
    match cmd {
        Command::Restart(s) => {
            let mut lines = vec!["# restart the kernel".to_string()];
            match s.framework.unwrap_or(framework) {
                Framework::Pytorch => {
                    if s.no_caching == Some(true) {
                        lines.push("# PYTORCH_NO_CUDA_MEMORY_CACHING=1".into());
                    }
                    if let Some(Some(mb)) = s.max_split_size_mb {
                        lines.push(format!("# PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{mb}"));
                    }
                    lines.push("import torch".into());
                    if let Some(Some(f)) = s.per_process_memory_fraction {
                        lines.push(format!("torch.cuda.set_per_process_memory_fraction({f})"));
                    }
                }
                Framework::Tensorflow => {
                    lines.push("import tensorflow as tf".into());
                    if s.allow_growth == Some(true) {
                        lines.push("gpu = tf.config.list_physical_devices('GPU')[0]".into());
                        lines.push("tf.config.experimental.set_memory_growth(gpu, True)".into());
                    }
                    if let Some(Some(limit)) = s.memory_limit_bytes {
                        lines.push(format!(
                            "tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit={})])",
                            limit / MIB
                        ));
                    }
                }
                Framework::Jax => {
                    if s.preallocate == Some(false) {
                        lines.push("# XLA_PYTHON_CLIENT_PREALLOCATE=false".into());
                    }
                    if let Some(f) = s.mem_fraction {
                        lines.push(format!("# XLA_PYTHON_CLIENT_MEM_FRACTION={f}"));
                    }
                    lines.push("import jax, jax.numpy as jnp".into());
                }
            }
            lines.join("\n")
        }
        Command::Alloc {
            name,
            bytes,
            shape,
            dtype,
            ..
        } => {
            let (dims, dt) = match (bytes, shape) {
                (Some(b), _) => (size_expr(*b), "uint8".to_string()),
                (None, Some(s)) => (
                    s.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
                    dtype.map_or("float32", |d| d.torch_name()).to_string(),
                ),
                _ => ("?".into(), "float32".into()),
            };
            if tf {
                format!("{name} = tf.zeros([{dims}], tf.{dt})")
            } else if jax {
                format!("{name} = jnp.zeros(({dims},), jnp.{dt})")
            } else {
                format!("{name} = torch.empty({dims}, dtype=torch.{dt}, device=\"cuda\")")
            }
        }
        Command::Del { name } => format!("del {name}"),
        Command::Hold { name, items, cycle } => {
            let mut s = format!("{name} = [{}]", items.join(", "));
            if *cycle {
                s.push_str(&format!("\n{name}.append({name})  # a reference cycle"));
            }
            s
        }
        Command::Gc {} => "import gc\ngc.collect()".into(),
        Command::EmptyCache {} => "torch.cuda.empty_cache()".into(),
        Command::ClearSession {} => "tf.keras.backend.clear_session()".into(),
        Command::ResetPeakMemoryStats {} => "torch.cuda.reset_peak_memory_stats()".into(),
        Command::Model {
            name,
            layers,
            width,
            input_dim,
            classes,
            ..
        } => {
            if tf {
                format!(
                    "{name} = tf.keras.Sequential([tf.keras.layers.Dense({width}, activation='relu') for _ in range({layers})] + [tf.keras.layers.Dense({classes})])\n{name}.build((None, {input_dim}))"
                )
            } else {
                format!(
                    "{name} = nn.Sequential(nn.Linear({input_dim}, {width}), nn.ReLU(), *[m for _ in range({}) for m in (nn.Linear({width}, {width}), nn.ReLU())], nn.Linear({width}, {classes})).cuda()",
                    layers.saturating_sub(1)
                )
            }
        }
        Command::Optimizer {
            name, model, kind, ..
        } => format!("{name} = {}({model}.parameters())", kind.python()),
        Command::Data {
            name,
            samples,
            features,
            on_device,
            ..
        } => {
            if *on_device {
                format!("{name} = TensorDataset(X.cuda(), y.cuda())  # {samples} x {features}, all on the GPU")
            } else {
                format!("{name} = DataLoader(TensorDataset(X, y), batch_size=...)  # {samples} x {features}, on the host")
            }
        }
        Command::Forward {
            name,
            model,
            batch_size,
            no_grad,
            amp,
            ..
        } => {
            let mut s = format!("x, y = next(batches)  # batch of {batch_size}\n");
            if *no_grad {
                s.push_str("with torch.no_grad():\n    ");
            }
            if *amp {
                s.push_str("with torch.autocast('cuda', dtype=torch.float16):\n    ");
            }
            s.push_str(&format!("{name} = criterion({model}(x.cuda()), y.cuda())"));
            s
        }
        Command::Backward { name, retain_graph } => {
            if *retain_graph {
                format!("{name}.backward(retain_graph=True)")
            } else {
                format!("{name}.backward()")
            }
        }
        Command::Step { optimizer } => format!("{optimizer}.step()"),
        Command::ZeroGrad {
            optimizer,
            set_to_none,
        } => format!("{optimizer}.zero_grad(set_to_none={})", py_bool(*set_to_none)),
        Command::Train {
            model,
            optimizer,
            steps,
            batch_size,
            accumulate,
            set_to_none,
            loss_history,
            amp,
            checkpointing,
            ..
        } => {
            let forward = if *checkpointing {
                format!("checkpoint_sequential({model}, segments, x.cuda())")
            } else {
                format!("{model}(x.cuda())")
            };
            let mut s = format!("for step in range({steps}):  # batch {batch_size}\n");
            if *accumulate > 1 {
                s.push_str(&format!("    for x, y in micro_batches(batch, {accumulate}):\n    "));
            }
            if *amp {
                s.push_str("    with torch.autocast('cuda', dtype=torch.float16):\n    ");
            }
            s.push_str(&format!("    loss = criterion({forward}, y.cuda())"));
            if *accumulate > 1 {
                s.push_str(&format!(" / {accumulate}"));
            }
            s.push('\n');
            if *accumulate > 1 {
                s.push_str("    ");
            }
            s.push_str("    loss.backward()\n");
            if *accumulate > 1 {
                s.push_str("    ");
            }
            s.push_str(match loss_history {
                LossHistory::Item => "    total_loss += loss.item()\n",
                LossHistory::Tensor => "    total_loss += loss  # keeps every step's graph reachable\n",
            });
            s.push_str(&format!(
                "    {optimizer}.step()\n    {optimizer}.zero_grad(set_to_none={})",
                py_bool(*set_to_none)
            ));
            s
        }
        Command::FindBatchSize { threshold, .. } => format!(
            "# try batch sizes 1, 2, 4, ... and keep the largest whose step peak stays under {threshold} of the memory limit"
        ),
        Command::Estimate { batch_size, .. } => {
            format!("# estimate parameters, gradients, optimizer state and activations at batch {batch_size}")
        }
        Command::TfSession { name } => format!("{name} = tf.compat.v1.Session()"),
        Command::Close { name } => format!("{name}.close()"),
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

fn change(label: &str, before: u64, after: u64) -> String {
    match after.cmp(&before) {
        std::cmp::Ordering::Greater => format!("{label} rose by {}", format_size(after - before)),
        std::cmp::Ordering::Less => format!("{label} fell by {}", format_size(before - after)),
        std::cmp::Ordering::Equal => format!("{label} did not move"),
    }
}

/// Which of the three numbers moved, and by how much.
pub fn moved(before: &Stats, after: &Stats) -> String {
    format!(
        "{}; {}; {}.",
        change("Allocated", before.allocated_bytes, after.allocated_bytes),
        change("reserved", before.reserved_bytes, after.reserved_bytes),
        change(
            "nvidia-smi",
            before.device_used_bytes,
            after.device_used_bytes
        ),
    )
}

/// Where to read more about what a command does.
pub fn fact_link(cmd: &Command) -> (&'static str, &'static str) {
    match cmd {
        Command::EmptyCache {} | Command::Alloc { .. } | Command::ResetPeakMemoryStats {} => (
            "PyTorch: memory management",
            "https://pytorch.org/docs/stable/notes/cuda.html#memory-management",
        ),
        Command::Del { .. } | Command::Hold { .. } | Command::Gc {} => (
            "Python: the del statement and gc",
            "https://docs.python.org/3/library/gc.html",
        ),
        Command::ClearSession {} | Command::TfSession { .. } | Command::Close { .. } => (
            "TensorFlow: limiting GPU memory growth",
            "https://www.tensorflow.org/guide/gpu#limiting_gpu_memory_growth",
        ),
        Command::Restart(_) => (
            "JAX: GPU memory allocation",
            "https://jax.readthedocs.io/en/latest/gpu_memory_allocation.html",
        ),
        _ => (
            "PyTorch FAQ: out of memory",
            "https://pytorch.org/docs/stable/notes/faq.html",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::parse_line;

    fn py(line: &str, f: Framework) -> String {
        code(&parse_line(line).command.unwrap(), f)
    }

    #[test]
    fn tensor_commands_in_each_framework() {
        let alloc = r#"{"cmd":"alloc","name":"x","bytes":67108864}"#;
        assert_eq!(
            py(alloc, Framework::Pytorch),
            "x = torch.empty(64 * 2**20, dtype=torch.uint8, device=\"cuda\")"
        );
        assert_eq!(
            py(alloc, Framework::Tensorflow),
            "x = tf.zeros([64 * 2**20], tf.uint8)"
        );
        assert_eq!(
            py(alloc, Framework::Jax),
            "x = jnp.zeros((64 * 2**20,), jnp.uint8)"
        );
        assert_eq!(
            py(
                r#"{"cmd":"hold","name":"h","items":["x"],"cycle":true}"#,
                Framework::Pytorch
            ),
            "h = [x]\nh.append(h)  # a reference cycle"
        );
        assert!(py(
            r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","loss_history":"tensor"}"#,
            Framework::Pytorch
        )
        .contains("total_loss += loss  #"));
    }

    #[test]
    fn moved_names_the_three_numbers() {
        let before = Stats {
            allocated_bytes: 64 * MIB,
            reserved_bytes: 64 * MIB,
            device_used_bytes: 364 * MIB,
            ..Stats::default()
        };
        let after = Stats {
            allocated_bytes: 0,
            ..before.clone()
        };
        assert_eq!(
            moved(&before, &after),
            "Allocated fell by 64.00 MiB; reserved did not move; nvidia-smi did not move."
        );
    }
}

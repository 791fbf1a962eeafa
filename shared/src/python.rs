//! The Python a command stands for, in the framework chosen (the code pane),
//! and the plain-language account of which of the three numbers moved.

use crate::command::*;
use crate::train::kinds::Norm;
use crate::train::spec::Kind;
use crate::train::{OptimizerKind, OptimizerSpec};
use crate::types::Framework;
use crate::units::MIB;

mod cell;
mod compiled;
mod vllm;
pub use cell::{append as append_to_cell, cell_code, code_after, imports};
use vllm::serve_code;

fn size_expr(bytes: u64) -> String {
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} * 2**20", bytes / MIB)
    } else {
        bytes.to_string()
    }
}

/// The line(s) of Python a command stands for.
pub fn code(cmd: &Command, framework: Framework) -> String {
    match cmd {
        Command::Restart(s) => restart_code(s, s.framework.unwrap_or(framework)),
        Command::Alloc(a) => alloc_code(a, framework),
        Command::Del(a) => format!("del {}", a.name),
        Command::Hold(a) => {
            let mut s = format!("{} = [{}]", a.name, a.items.join(", "));
            if a.cycle {
                s.push_str(&format!("\n{0}.append({0})  # a reference cycle", a.name));
            }
            s
        }
        Command::Assign(a) => format!("{} = {}", a.name, a.value),
        Command::Append(a) => format!("{}.append({})", a.name, a.item),
        Command::Gc {} => "import gc\ngc.collect()".into(),
        Command::EmptyCache {} if framework != Framework::Pytorch => format!(
            "# {} has no empty_cache(): its BFC pool keeps what it reserved",
            framework.display_name()
        ),
        Command::EmptyCache {} => "torch.cuda.empty_cache()".into(),
        Command::ClearCublasWorkspaces {} if framework != Framework::Pytorch => format!(
            "# {} allocates no cuBLAS workspace through its allocator",
            framework.display_name()
        ),
        Command::ClearCublasWorkspaces {} => "torch._C._cuda_clearCublasWorkspaces()".into(),
        Command::ClearSession {} if framework == Framework::Jax => "jax.clear_caches()  # what JAX has nearest to clear_session()".into(),
        Command::ClearSession {} => "tf.keras.backend.clear_session()".into(),
        Command::ResetPeakMemoryStats {} => match framework {
            Framework::Pytorch => "torch.cuda.reset_peak_memory_stats()".into(),
            Framework::Tensorflow => "tf.config.experimental.reset_memory_stats('GPU:0')".into(),
            Framework::Jax => "# XLA's peak_bytes_in_use cannot be reset: the peak from here on is measured".into(),
        },
        Command::Model(a) if framework == Framework::Jax => compiled::params_code(a),
        Command::Model(a) => model_code(a, framework),
        Command::Optimizer(a) if framework != Framework::Pytorch => compiled::optimizer_code(a, framework),
        Command::Optimizer(a) => optimizer_code(a),
        Command::Data(a) if framework != Framework::Pytorch => compiled::data_code(a),
        // PyTorch's: the code the cell runs (a GPT's or CNN's fitted there).
        Command::Data(_) => cell_code(cmd, framework),
        Command::Forward(_) if framework == Framework::Pytorch => cell_code(cmd, framework),
        Command::Forward(a) => forward_code(a, framework),
        Command::Backward(a) => backward_code(a, framework),
        Command::Step(a) => match framework {
            Framework::Pytorch => format!("{}.step()", a.optimizer),
            Framework::Tensorflow => format!("{}.apply_gradients(zip(grads, model.trainable_variables))", a.optimizer),
            Framework::Jax => format!(
                "updates, {0}_state = {0}.update(grads, {0}_state, model)\nmodel = optax.apply_updates(model, updates)",
                a.optimizer
            ),
        },
        Command::ZeroGrad(a) => match (framework, a.set_to_none) {
            (Framework::Pytorch, _) => format!("{}.zero_grad(set_to_none={})", a.optimizer, py_bool(a.set_to_none)),
            (_, true) => "del grads".into(),
            (Framework::Jax, false) => "grads = jax.tree.map(jnp.zeros_like, grads)".into(),
            (Framework::Tensorflow, false) => "grads = [tf.zeros_like(g) for g in grads]".into(),
        },
        Command::Train(_) if framework == Framework::Pytorch => cell_code(cmd, framework),
        Command::Train(a) => compiled::train_code(a, framework),
        Command::FindBatchSize(a) => format!(
            "# try batch sizes 1, 2, 4, ... and keep the largest whose step peak stays under {} of the memory limit{}",
            a.threshold,
            techniques(a)
        ),
        Command::Estimate(a) => format!(
            "# estimate parameters, gradients, optimizer state and activations at batch {}",
            a.batch_size
        ),
        Command::TfSession(a) => format!("{} = tf.compat.v1.Session()", a.name),
        Command::Close(a) => format!("{}.close()", a.name),
        Command::Generate(a) => generate_code(a, false),
        Command::Serve(a) => serve_code(a),
        Command::PrepareKbit(a) => format!(
            "from peft import prepare_model_for_kbit_training\n{0} = prepare_model_for_kbit_training({0})  # the rest upcast to float32; checkpointing on",
            a.model
        ),
        Command::Lora(a) => format!(
            "from peft import LoraConfig, get_peft_model\n{0} = get_peft_model({0}, LoraConfig(r={1}, lora_alpha={2}{3}, task_type=\"CAUSAL_LM\"))  # adapters; the rest frozen",
            a.model,
            a.rank,
            2 * a.rank,
            if a.all_linear { ", target_modules=\"all-linear\"" } else { "" }
        ),
    }
}

/// A Hugging Face model from its config: transformers' `from_config`
/// builds the architecture with random weights (the same memory as the
/// published ones), in the config's type unless `dtype` says otherwise;
/// or `from_pretrained` onto the GPU (4-bit, or asked for).
fn hf_model_code(a: &ModelArgs) -> String {
    let dtype = a.dtype.map_or(String::new(), |d| {
        format!(", dtype=torch.{}", d.torch_name())
    });
    if a.quantization.is_some() || a.from_pretrained == Some(true) {
        // `from_pretrained` loads weights from files (bitsandbytes
        // quantizing them as they come): the published ones, or a config's
        // random ones saved first.
        let (saved, source) = match &a.config {
            Some(serde_json::Value::String(repo)) => (String::new(), format!("{repo:?}")),
            Some(v) => (
                format!("AutoModelForCausalLM.from_config(AutoConfig.for_model(**{})).save_pretrained(\"model\")  # on the host\n", python_literal(v)),
                "\"model\"".to_string(),
            ),
            None => (String::new(), "...".to_string()),
        };
        let (import, quantization) = match &a.quantization {
            Some(quant) => {
                let compute = a.dtype.map_or("bfloat16", |d| d.torch_name());
                (
                    ", BitsAndBytesConfig",
                    format!(
                        ", quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"{quant}\", bnb_4bit_use_double_quant={}, bnb_4bit_compute_dtype=torch.{compute})",
                        py_bool(a.double_quant.unwrap_or(true))
                    ),
                )
            }
            None => ("", String::new()),
        };
        return format!(
            "from transformers import AutoConfig, AutoModelForCausalLM{import}\n{saved}{} = AutoModelForCausalLM.from_pretrained({source}{quantization}{dtype}, device_map={{\"\": 0}})",
            a.name
        );
    }
    let config = match &a.config {
        Some(serde_json::Value::String(repo)) => format!("AutoConfig.from_pretrained({repo:?})"),
        Some(v) => format!("AutoConfig.for_model(**{})", python_literal(v)),
        None => "AutoConfig.from_pretrained(...)".into(),
    };
    format!(
        "from transformers import AutoConfig, AutoModelForCausalLM\n{} = AutoModelForCausalLM.from_config({config}{dtype}).to(\"cuda\")  # the architecture with random weights: the memory of the real ones",
        a.name
    )
}

/// A JSON value as the Python literal of the same value.
fn python_literal(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "None".into(),
        Value::Bool(b) => py_bool(*b).into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(python_literal)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Object(fields) => format!(
            "{{{}}}",
            fields
                .iter()
                .map(|(k, v)| format!("{k:?}: {}", python_literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `out = model.generate(...)`, greedy; eager attention switched on first
/// (and sdpa back, after code that switched to eager: `eager_before`).
fn generate_code(a: &GenerateArgs, eager_before: bool) -> String {
    let model = &a.model;
    let mut s = String::new();
    if a.attention.is_eager() {
        s.push_str(&format!("{model}.set_attn_implementation(\"eager\")\n"));
    } else if eager_before {
        s.push_str(&format!("{model}.set_attn_implementation(\"sdpa\")\n"));
    }
    let (b, p) = (a.batch_size.unwrap_or(1), a.prompt_len.unwrap_or(1));
    let ids = match &a.input_ids {
        Some(ids) => ids.clone(),
        None => format!("torch.randint(0, {model}.config.vocab_size, ({b}, {p}), device=\"cuda\")"),
    };
    let mask = match &a.attention_mask {
        Some(mask) => format!(", attention_mask={mask}"),
        None => String::new(),
    };
    // A static cache on a GPU would have generate compile the forward.
    let cache = match a.cache {
        Cache::Static => ", cache_implementation=\"static\", disable_compile=True",
        Cache::Dynamic => "",
    };
    let call = format!(
        "{model}.generate({ids}{mask}, max_new_tokens={}, do_sample=False{cache})",
        a.new_tokens
    );
    match &a.name {
        Some(name) => s.push_str(&format!("{name} = {call}")),
        None => s.push_str(&call),
    }
    s
}

fn restart_code(s: &RestartSettings, framework: Framework) -> String {
    let mut lines = vec!["# restart the kernel".to_string()];
    match framework {
        Framework::Pytorch => {
            if s.no_caching == Some(true) {
                lines.push("# PYTORCH_NO_CUDA_MEMORY_CACHING=1".into());
            }
            let mut conf = Vec::new();
            if let Some(Some(mb)) = s.max_split_size_mb {
                conf.push(format!("max_split_size_mb:{mb}"));
            }
            if s.expandable_segments == Some(true) {
                conf.push("expandable_segments:True".into());
            }
            if let Some(d) = s.roundup_power2_divisions.filter(|d| !d.is_off()) {
                conf.push(format!("roundup_power2_divisions:{d}"));
            }
            if !conf.is_empty() {
                lines.push(format!("# PYTORCH_CUDA_ALLOC_CONF={}", conf.join(",")));
            }
            if let Some(Some(c)) = &s.cublas_workspace_config {
                lines.push(format!("# CUBLAS_WORKSPACE_CONFIG={c}"));
            }
            if s.cublas_workspace_cache == Some(true) {
                lines.push("# TORCH_CUBLAS_WORKSPACE_CACHE=1".into());
            }
            if s.cublaslt_unified_workspace == Some(true) {
                lines.push("# TORCH_CUBLASLT_UNIFIED_WORKSPACE=1".into());
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

fn alloc_code(a: &AllocArgs, framework: Framework) -> String {
    let name = &a.name;
    let (dims, dt) = match (a.bytes, &a.shape) {
        (Some(b), _) => (size_expr(b), "uint8".to_string()),
        (None, Some(s)) => (
            s.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
            a.dtype.map_or("float32", |d| d.torch_name()).to_string(),
        ),
        _ => ("?".into(), "float32".into()),
    };
    match framework {
        Framework::Tensorflow => format!("{name} = tf.zeros([{dims}], tf.{dt})"),
        Framework::Jax => format!("{name} = jnp.zeros(({dims},), jnp.{dt})"),
        Framework::Pytorch => {
            format!("{name} = torch.empty({dims}, dtype=torch.{dt}, device=\"cuda\")")
        }
    }
}

fn model_code(a: &ModelArgs, framework: Framework) -> String {
    if a.kind == ModelKind::Hf {
        return hf_model_code(a);
    }
    let (name, layers, width, input_dim, classes) =
        (&a.name, a.layers, a.width(), a.input_dim, a.classes);
    if let Some(code) = kind_code(a) {
        return code;
    }
    if framework == Framework::Tensorflow {
        format!(
            "{name} = tf.keras.Sequential([tf.keras.Input(shape=({input_dim},))] + [tf.keras.layers.Dense({width}, activation='relu') for _ in range({layers})] + [tf.keras.layers.Dense({classes})])"
        )
    } else {
        format!(
            "{name} = nn.Sequential(nn.Linear({input_dim}, {width}), nn.ReLU(), *[m for _ in range({}) for m in (nn.Linear({width}, {width}), nn.ReLU())], nn.Linear({width}, {classes})).cuda()",
            layers.saturating_sub(1)
        )
    }
}

/// A CNN or a transformer, as the module that builds it.
pub(crate) fn kind_code(a: &ModelArgs) -> Option<String> {
    let spec = a.spec().ok()?;
    let name = &a.name;
    Some(match spec.kind {
        Kind::Mlp => return None,
        Kind::Cnn(c) => format!(
            "{name} = CNN(channels={}, image_size={}, blocks={}, width={}, classes={}).cuda()  # per block: Conv2d(3x3) -> BatchNorm2d -> ReLU -> MaxPool2d(2); then Linear",
            c.channels, c.image_size, c.blocks, c.width, c.classes
        ),
        Kind::Transformer(t) => {
            let gpt = format!(
                "GPT(layers={}, width={}, heads={}, seq_len={}, vocab={}, mlp_ratio={}, norm=nn.{}, tied={}).cuda()",
                t.layers,
                t.width,
                t.heads,
                t.seq_len,
                t.vocab,
                t.mlp_ratio,
                if t.norm == Norm::LayerNorm { "LayerNorm" } else { "RMSNorm" },
                if t.tied { "True" } else { "False" }
            );
            match t.lora_rank {
                0 => format!("{name} = {gpt}"),
                r => format!("{name} = get_peft_model({gpt}, LoraConfig(r={r}, target_modules=\"all-linear\"))  # adapters on every block's linear layers; the rest frozen"),
            }
        }
    })
}

fn optimizer_code(a: &OptimizerArgs) -> String {
    let mut args = format!("{}.parameters()", a.model);
    if let Some(lr) = a.lr {
        args.push_str(&format!(", lr={lr}"));
    }
    if a.kind == OptimizerKind::Momentum {
        args.push_str(", momentum=0.9");
    }
    let class = OptimizerSpec::new(a.kind, a.bits).map_or(a.kind.python(), |s| s.python());
    format!("{} = {class}({args})", a.name)
}

/// The techniques a batch-size search trains with, in words.
fn techniques(a: &FindBatchSizeArgs) -> String {
    let mut words = Vec::new();
    if a.amp.is_on() {
        words.push(format!("autocast to {}", a.amp.torch_dtype()));
    }
    if a.checkpointing {
        words.push("checkpointing".to_string());
    }
    if !a.attention.is_eager() {
        words.push("fused attention".to_string());
    }
    match words.is_empty() {
        true => String::new(),
        false => format!(", with {}", words.join(", ")),
    }
}

/// `loss = ...`: the forward pass up to the loss, recording what the
/// backward pass needs (PyTorch's autograd, a GradientTape, `jax.vjp`).
fn forward_code(a: &ForwardArgs, framework: Framework) -> String {
    let (name, model) = (&a.name, &a.model);
    let batch = format!("x, y = next(batches)  # batch of {}\n", a.batch_size);
    match (framework, a.no_grad) {
        (Framework::Pytorch, _) => cell_code(&Command::Forward(a.clone()), framework),
        (Framework::Tensorflow, true) => format!("{batch}{name} = loss_fn(y, {model}(x, training=False))"),
        (Framework::Tensorflow, false) => format!(
            "{batch}with tf.GradientTape() as tape:\n    {name} = loss_fn(y, {model}(x, training=True))"
        ),
        (Framework::Jax, true) => format!("{batch}{name} = loss_fn({model}, x, y)"),
        (Framework::Jax, false) => format!(
            "{batch}{name}, {name}_vjp = jax.vjp(lambda p: loss_fn(p, x, y), {model})"
        ),
    }
}

fn backward_code(a: &BackwardArgs, framework: Framework) -> String {
    let name = &a.name;
    match (framework, a.retain_graph) {
        (Framework::Pytorch, true) => format!("{name}.backward(retain_graph=True)"),
        (Framework::Pytorch, false) => format!("{name}.backward()"),
        (Framework::Tensorflow, _) => {
            format!("grads = tape.gradient({name}, model.trainable_variables)")
        }
        (Framework::Jax, _) => format!("grads, = {name}_vjp(jnp.ones(()))"),
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::parse_line;

    fn py(line: &str, f: Framework) -> String {
        code(&parse_line(line).command.unwrap(), f)
    }

    /// JAX's and Keras's own loops, not PyTorch's, for a compiled step.
    #[test]
    fn a_training_loop_in_each_framework() {
        let train = r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","steps":5}"#;
        let donated = r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","donate":true}"#;
        assert!(py(train, Framework::Pytorch).contains("loss.backward()"));
        let jax = py(train, Framework::Jax);
        assert!(jax.starts_with("@jax.jit\ndef train_step("), "{jax}");
        assert!(
            jax.contains("m, o_state, loss = train_step(m, o_state, x, y)"),
            "{jax}"
        );
        assert!(!jax.contains("backward"));
        assert!(py(donated, Framework::Jax).starts_with("@partial(jax.jit, donate_argnums=(0, 1))"));
        let keras = py(train, Framework::Tensorflow);
        assert!(
            keras.starts_with("m.fit(x_train, y_train, batch_size=64, steps_per_epoch=5"),
            "{keras}"
        );
        let executor =
            r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","jit_compile":false}"#;
        let keras = py(executor, Framework::Tensorflow);
        assert!(
            keras.starts_with("m.jit_compile = False  # no XLA"),
            "{keras}"
        );
        assert!(keras.ends_with("epochs=1)"), "{keras}");
    }

    /// What a control adds to the code cell is the framework's own code:
    /// PyTorch's loop, Keras's `fit`, JAX's arrays.
    #[test]
    fn the_cell_gets_what_it_runs() {
        let train = r#"{"cmd":"train","model":"m","optimizer":"o","data":"d"}"#;
        let line = parse_line(train).command.unwrap();
        assert!(cell_code(&line, Framework::Pytorch).contains("loss.backward()"));
        assert!(cell_code(&line, Framework::Tensorflow).starts_with("m.fit(x_train, y_train"));
        let model = parse_line(r#"{"cmd":"model","name":"m"}"#).command.unwrap();
        assert!(cell_code(&model, Framework::Tensorflow).starts_with("m = tf.keras.Sequential"));
        assert!(cell_code(&model, Framework::Jax).contains("jnp.zeros"));
    }

    /// Under JAX and TensorFlow no line of the setup is PyTorch's.
    #[test]
    fn a_model_its_optimizer_and_data_in_each_framework() {
        let model = r#"{"cmd":"model","name":"m","layers":2,"width":8,"input_dim":4,"classes":3}"#;
        let opt = r#"{"cmd":"optimizer","name":"o","model":"m","kind":"momentum"}"#;
        let data = r#"{"cmd":"data","name":"d","samples":100,"features":4,"classes":3}"#;
        assert_eq!(
            py(model, Framework::Jax),
            "dims = [4, 8, 8, 3]\nm = [(jnp.zeros((i, o)), jnp.zeros((o,))) for i, o in zip(dims[:-1], dims[1:])]"
        );
        assert_eq!(
            py(opt, Framework::Jax),
            "o = optax.sgd(0.05, momentum=0.9)\no_state = o.init(m)"
        );
        assert!(py(opt, Framework::Tensorflow).starts_with(
            "o = tf.keras.optimizers.SGD(0.05, momentum=0.9)\nm.compile(optimizer=o, "
        ));
        let gpt = r#"{"cmd":"model","name":"g","kind":"transformer","layers":1,"width":64,"heads":2,"seq_len":32,"vocab":100}"#;
        let params = py(gpt, Framework::Jax);
        assert!(params.starts_with("g = init_params(jax.random.key(0), GPT(layers=1"));
        assert!(
            params.ends_with("tied=True))") && !params.contains("cuda"),
            "{params}"
        );
        for f in [Framework::Jax, Framework::Tensorflow] {
            for line in [opt, data] {
                let code = py(line, f);
                assert!(
                    !code.contains("torch") && !code.contains(".cuda()"),
                    "{code}"
                );
            }
        }
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
    fn each_loss_history_and_a_batch_search_s_techniques_are_written() {
        for h in LossHistory::ALL {
            let line = format!(
                r#"{{"cmd":"train","model":"m","optimizer":"o","data":"d","loss_history":"{}"}}"#,
                h.id()
            );
            assert!(py(&line, Framework::Pytorch).contains(h.code()), "{line}");
        }
        let find = r#"{"cmd":"find_batch_size","model":"m","optimizer":"o","data":"d","amp":"bfloat16","checkpointing":true,"attention":"sdpa"}"#;
        assert!(py(find, Framework::Pytorch).ends_with(
            "memory limit, with autocast to torch.bfloat16, checkpointing, fused attention"
        ));
        let plain = r#"{"cmd":"find_batch_size","model":"m","optimizer":"o","data":"d"}"#;
        assert!(py(plain, Framework::Pytorch).ends_with("memory limit"));
    }

    /// A step's statements in TensorFlow and JAX are theirs: a
    /// GradientTape and `tape.gradient`, `jax.vjp` and optax; nothing of
    /// PyTorch's (`.backward()`, `.grad`, `torch.`).
    #[test]
    fn a_step_speaks_each_frameworks_language() {
        let lines = [
            r#"{"cmd":"forward","name":"loss","model":"model","data":"d","batch_size":8}"#,
            r#"{"cmd":"forward","name":"out","model":"model","data":"d","batch_size":8,"no_grad":true}"#,
            r#"{"cmd":"backward","name":"loss"}"#,
            r#"{"cmd":"step","optimizer":"opt"}"#,
            r#"{"cmd":"zero_grad","optimizer":"opt","set_to_none":true}"#,
            r#"{"cmd":"zero_grad","optimizer":"opt","set_to_none":false}"#,
            r#"{"cmd":"empty_cache"}"#,
            r#"{"cmd":"reset_peak_memory_stats"}"#,
            r#"{"cmd":"clear_cublas_workspaces"}"#,
        ];
        for f in [Framework::Tensorflow, Framework::Jax] {
            let code: Vec<String> = lines.iter().map(|l| py(l, f)).collect();
            for c in &code {
                assert!(
                    !c.contains("torch")
                        && !c.contains(".backward(")
                        && !c.replace(".gradient", "").contains(".grad"),
                    "{f:?}: {c}"
                );
            }
            let tape = f == Framework::Tensorflow;
            assert_eq!(
                code[0].contains("with tf.GradientTape() as tape:"),
                tape,
                "{}",
                code[0]
            );
            assert_eq!(code[0].contains("jax.vjp("), !tape, "{}", code[0]);
            assert_eq!(code[2].contains("tape.gradient(loss"), tape, "{}", code[2]);
            assert_eq!(
                code[3].contains("optax.apply_updates"),
                !tape,
                "{}",
                code[3]
            );
            assert_eq!(code[4], "del grads");
        }
    }
}

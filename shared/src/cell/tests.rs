//! The cell's translations, exactly.

use super::*;
use crate::command::*;
use crate::train::OptimizerKind;
use crate::types::Dtype;

fn run(source: &str, framework: Framework) -> Vec<Vec<Command>> {
    steps(source, framework)
        .unwrap()
        .into_iter()
        .map(|s| s.commands.unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn torch(source: &str) -> Vec<Command> {
    run(source, Framework::Pytorch).concat()
}

fn error(source: &str, framework: Framework) -> CellError {
    let steps = steps(source, framework).unwrap();
    steps
        .into_iter()
        .find_map(|s| s.commands.err())
        .expect("an error")
}

fn alloc(name: &str, shape: &[u64], dtype: Dtype) -> Command {
    Command::Alloc(AllocArgs {
        name: name.into(),
        bytes: None,
        shape: Some(shape.to_vec()),
        dtype: Some(dtype),
        category: None,
    })
}

fn name(n: &str) -> NameArgs {
    NameArgs { name: n.into() }
}

const MLP: &str = "model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()";

fn mlp(layers: u32, keras: bool) -> Command {
    Command::Model(ModelArgs {
        keras,
        ..ModelArgs::mlp("model", layers, 1024)
    })
}

const DATA: &str = "X = torch.randn(60000, 784)\ny = torch.randint(0, 10, (60000,))\nloader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)\n";

fn data(on_device: bool) -> Command {
    Command::Data(DataArgs {
        name: "loader".into(),
        samples: 60_000,
        features: 784,
        classes: 10,
        on_device,
    })
}

#[test]
fn names_references_and_cycles() {
    let cmds = torch(
        "import torch, gc\nx = torch.randn(1024, 1024, device=\"cuda\")\ny = x\ndel x\nh = [y]; h.append(h)\ngc.collect()\ntorch.cuda.empty_cache()",
    );
    assert_eq!(
        cmds,
        vec![
            alloc("x", &[1024, 1024], Dtype::Float32),
            Command::Assign(AssignArgs {
                name: "y".into(),
                value: "x".into()
            }),
            Command::Del(name("x")),
            Command::Hold(HoldArgs {
                name: "h".into(),
                items: vec!["y".into()],
                cycle: false
            }),
            Command::Append(AppendArgs {
                name: "h".into(),
                item: "h".into()
            }),
            Command::Gc {},
            Command::EmptyCache {},
        ]
    );
}

#[test]
fn tensor_factories_of_each_framework() {
    assert_eq!(
        torch("a = torch.zeros((256, 4), dtype=torch.float16).cuda()\nb = torch.empty(64 * 2**20, dtype=torch.uint8, device='cuda:0')\nc = a + 1"),
        vec![
            alloc("a", &[256, 4], Dtype::Float16),
            alloc("b", &[64 << 20], Dtype::Uint8),
            alloc("c", &[256, 4], Dtype::Float16)
        ]
    );
    assert_eq!(
        run(
            "import tensorflow as tf\nx = tf.random.normal([512, 512])",
            Framework::Tensorflow
        )
        .concat(),
        vec![alloc("x", &[512, 512], Dtype::Float32)]
    );
    assert_eq!(
        run("import jax, jax.numpy as jnp\nkey = jax.random.PRNGKey(0)\nx = jnp.zeros((1024, 256), jnp.bfloat16)\ny = jax.random.normal(key, (8, 8))", Framework::Jax).concat(),
        vec![alloc("x", &[1024, 256], Dtype::Bfloat16), alloc("y", &[8, 8], Dtype::Float32)]
    );
    // Host arrays take no GPU memory; moving one to the GPU does.
    assert_eq!(
        torch("h = torch.randn(10, 10)\ng = h.to('cuda')"),
        vec![alloc("g", &[10, 10], Dtype::Float32)]
    );
}

#[test]
fn a_name_rebound_to_a_host_value_drops_its_reference() {
    assert_eq!(
        torch("x = torch.ones(4, device='cuda')\nx = 3"),
        vec![alloc("x", &[4], Dtype::Float32), Command::Del(name("x"))]
    );
}

#[test]
fn models_and_optimizers() {
    assert_eq!(torch(MLP), vec![mlp(2, false)]);
    let repeated = "model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), *[m for _ in range(3) for m in (nn.Linear(1024, 1024), nn.ReLU())], nn.Linear(1024, 10)).cuda()";
    assert_eq!(torch(repeated), vec![mlp(4, false)]);
    assert_eq!(
        torch(&format!(
            "{MLP}\nopt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)"
        )),
        vec![
            mlp(2, false),
            Command::Optimizer(OptimizerArgs {
                name: "opt".into(),
                model: "model".into(),
                kind: OptimizerKind::Momentum,
                lr: Some(0.1),
                bits: 32,
            })
        ]
    );
    for import in ["import bitsandbytes as bnb\n", ""] {
        let cell = format!("{import}{MLP}\nopt = bnb.optim.AdamW8bit(model.parameters())");
        assert_eq!(
            torch(&cell)[1],
            Command::Optimizer(OptimizerArgs {
                name: "opt".into(),
                model: "model".into(),
                kind: OptimizerKind::Adamw,
                lr: None,
                bits: 8,
            })
        );
    }
    let e = error(
        &format!("{MLP}\nopt = bnb.optim.SGD8bit(model.parameters(), lr=0.1)"),
        Framework::Pytorch,
    );
    assert!(e.message.contains("no state"), "{e}");
    let half =
        torch("m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).cuda().half()");
    assert!(
        matches!(&half[0], Command::Model(a) if a.dtype == Some(Dtype::Float16) && a.layers == 1)
    );
    let e = error(
        "m = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 32), nn.Linear(32, 2))",
        Framework::Pytorch,
    );
    assert!(e.message.contains("one width"), "{e}");
}

fn train(steps: u64) -> TrainArgs {
    TrainArgs::plain("model", "opt", "loader", steps, 64)
}

#[test]
fn a_training_loop_is_one_train_command() {
    let source = format!(
        "{DATA}{MLP}\nopt = torch.optim.Adam(model.parameters())\ncriterion = nn.CrossEntropyLoss()\n\
for step, (x, y) in zip(range(20), loader):\n    x, y = x.cuda(), y.cuda()\n    loss = criterion(model(x), y)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
    );
    let cmds = torch(&source);
    assert_eq!(cmds[0], data(false));
    assert_eq!(cmds.last(), Some(&Command::Train(train(20))));
    assert_eq!(cmds.len(), 4);
}

#[test]
fn loops_carry_their_techniques() {
    let source = format!(
        "{DATA}{MLP}\nopt = torch.optim.Adam(model.parameters())\nlosses = []\n\
for epoch in range(2):\n    for i, (x, y) in enumerate(loader):\n        with torch.autocast('cuda', dtype=torch.float16):\n            out = model(x)\n            loss = F.cross_entropy(out, y) / 4\n        loss.backward()\n        losses.append(loss)\n        if (i + 1) % 4 == 0:\n            opt.step()\n            opt.zero_grad(set_to_none=False)\n"
    );
    let cmds = torch(&source);
    let Some(Command::Train(t)) = cmds.last() else {
        panic!("{cmds:?}")
    };
    assert_eq!(
        *t,
        TrainArgs {
            steps: 2 * 60_000u64.div_ceil(64).div_ceil(4),
            accumulate: 4,
            amp: Amp::Float16,
            set_to_none: false,
            loss_history: LossHistory::List,
            ..train(0)
        }
    );
}

#[test]
fn autocast_reads_its_dtype() {
    let lp = |with: &str| {
        format!(
            "{DATA}{MLP}\nopt = torch.optim.Adam(model.parameters())\n\
for x, y in loader:\n    with {with}:\n        loss = F.cross_entropy(model(x), y)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
        )
    };
    for (with, amp) in [
        (
            "torch.autocast('cuda', dtype=torch.bfloat16)",
            Amp::Bfloat16,
        ),
        (
            "torch.autocast(device_type='cuda', dtype=torch.float16)",
            Amp::Float16,
        ),
        ("torch.cuda.amp.autocast()", Amp::Float16),
    ] {
        let cmds = torch(&lp(with));
        let Some(Command::Train(t)) = cmds.last() else {
            panic!("{cmds:?}")
        };
        assert_eq!(t.amp, amp, "{with}");
    }
}

#[test]
fn a_loop_missing_a_part_says_which() {
    let source = format!("{DATA}{MLP}\nopt = torch.optim.Adam(model.parameters())\nfor x, y in loader:\n    loss = F.cross_entropy(model(x), y)\n    opt.step()\n    opt.zero_grad()\n");
    let e = error(&source, Framework::Pytorch);
    assert_eq!(e.line, 6);
    assert!(e.message.contains("never calls loss.backward()"), "{e}");
}

#[test]
fn forward_passes_and_contexts() {
    let source = format!("{DATA}{MLP}\nx, y = next(iter(loader))\nwith torch.no_grad():\n    out = model(x)\nloss = F.cross_entropy(model(x), y)\nloss.backward(retain_graph=True)");
    let cmds = torch(&source);
    let forward = |n: &str, no_grad| {
        Command::Forward(ForwardArgs {
            name: n.into(),
            model: "model".into(),
            data: "loader".into(),
            batch_size: 64,
            no_grad,
            amp: Amp::Off,
            checkpointing: false,
            attention: Default::default(),
            #[cfg(feature = "given-batch")]
            batch: None,
        })
    };
    assert_eq!(
        cmds[2..],
        [
            forward("out", true),
            forward("loss", false),
            Command::Backward(BackwardArgs {
                name: "loss".into(),
                retain_graph: true
            })
        ]
    );
}

#[test]
fn keras_compile_fit_and_the_advice() {
    let source = "import tensorflow as tf\n(x_train, y_train), _ = tf.keras.datasets.mnist.load_data()\n\
model = tf.keras.Sequential([tf.keras.layers.Flatten(input_shape=(28, 28)), tf.keras.layers.Dense(1024, activation='relu'), tf.keras.layers.Dense(10)])\n\
model.compile(optimizer='adam', loss='sparse_categorical_crossentropy')\n\
model.fit(x_train, y_train, batch_size=64, epochs=1, steps_per_epoch=20)\n\
del model\ngc.collect()\ntf.keras.backend.clear_session()";
    let cmds = run(source, Framework::Tensorflow).concat();
    assert_eq!(cmds[0], mlp(1, true));
    assert!(
        matches!(&cmds[1], Command::Optimizer(a) if a.name == "model_optimizer" && a.kind == OptimizerKind::Adam)
    );
    assert_eq!(
        cmds[2],
        Command::Data(DataArgs {
            name: "model_data".into(),
            samples: 60_000,
            features: 784,
            classes: 10,
            on_device: false
        })
    );
    assert!(
        matches!(&cmds[3], Command::Train(t) if t.steps == 20 && t.batch_size == 64 && t.optimizer == "model_optimizer" && t.jit_compile)
    );
    assert_eq!(
        cmds[4..],
        [
            Command::Del(name("model")),
            Command::Gc {},
            Command::ClearSession {}
        ]
    );
}

/// `compile(jit_compile=False)`: the fit that follows runs on
/// TensorFlow's executor; `"auto"` (and no word) is XLA on a GPU.
#[test]
fn keras_compile_says_whether_xla_compiles_the_step() {
    let fit = |compile: &str| {
        let source = format!("import tensorflow as tf\nimport numpy as np\nx = np.zeros((640, 784))\ny = np.zeros((640,))\n\
model = tf.keras.Sequential([tf.keras.Input(shape=(784,)), tf.keras.layers.Dense(10)])\n\
model.compile(optimizer='sgd'{compile})\nmodel.fit(x, y, batch_size=64)");
        let cmds = run(&source, Framework::Tensorflow).concat();
        match cmds.last() {
            Some(Command::Train(t)) => t.jit_compile,
            other => panic!("{other:?}"),
        }
    };
    assert!(fit(""));
    assert!(fit(", jit_compile='auto'"));
    assert!(!fit(", jit_compile=False"));
    assert!(fit(", jit_compile=True"));
}

#[test]
fn tf1_sessions() {
    let source = "with tf.compat.v1.Session() as sess:\n    model = tf.keras.Sequential([tf.keras.Input(shape=(784,)), tf.keras.layers.Dense(1024), tf.keras.layers.Dense(10)])\nsess2 = tf.compat.v1.Session()\nsess2.close()";
    let cmds = run(source, Framework::Tensorflow).concat();
    assert_eq!(
        cmds,
        vec![
            Command::TfSession(name("sess")),
            mlp(1, true),
            Command::Close(name("sess")),
            Command::TfSession(name("sess2")),
            Command::Close(name("sess2")),
        ]
    );
}

#[test]
fn what_the_cell_cannot_run_says_so_at_its_line() {
    let e = error("x = 1\ndef f():\n    pass", Framework::Pytorch);
    assert_eq!(e.line, 2);
    assert!(
        e.message.contains("`def` is not in the cell's Python"),
        "{e}"
    );
    let e = error("x = tf.zeros([4])", Framework::Pytorch);
    assert!(
        e.message
            .contains("is TensorFlow, but this kernel runs PyTorch"),
        "{e}"
    );
    let e = error("x = torch.fft.fft(y)", Framework::Pytorch);
    assert!(e.message.contains("not in the cell's Python"), "{e}");
    let e = steps("x = torch.randn(3\n", Framework::Pytorch).unwrap_err();
    assert!(e.message.contains("SyntaxError"), "{e}");
    // A step that cannot run ends the list: what follows may need it.
    let s = steps("a = 1\nb = torch.nope()\nc = 2", Framework::Pytorch).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[1].source, "b = torch.nope()");
}

#[test]
fn the_code_pane_reads_back() {
    // What a button writes into the cell runs as the same command.
    for line in [
        r#"{"cmd":"del","name":"x"}"#,
        r#"{"cmd":"gc"}"#,
        r#"{"cmd":"empty_cache"}"#,
        r#"{"cmd":"clear_cublas_workspaces"}"#,
        r#"{"cmd":"reset_peak_memory_stats"}"#,
        r#"{"cmd":"model","name":"m","layers":3,"width":512}"#,
        r#"{"cmd":"optimizer","name":"o","model":"m","kind":"adamw"}"#,
        r#"{"cmd":"hold","name":"h","items":["x","y"]}"#,
        r#"{"cmd":"alloc","name":"x","shape":[3,5],"dtype":"float16"}"#,
        r#"{"cmd":"optimizer","name":"o","model":"m","kind":"momentum"}"#,
    ] {
        let cmd = parse_line(line).command.unwrap();
        let code = crate::python::code(&cmd, Framework::Pytorch);
        let back = torch(&code);
        assert_eq!(back.len(), 1, "{code}");
        assert_eq!(back[0], cmd, "{code}");
    }
    for line in [
        r#"{"cmd":"tf_session","name":"s"}"#,
        r#"{"cmd":"close","name":"s"}"#,
    ] {
        let cmd = parse_line(line).command.unwrap();
        let code = crate::python::code(&cmd, Framework::Tensorflow);
        assert_eq!(
            run(&code, Framework::Tensorflow).concat(),
            vec![cmd],
            "{code}"
        );
    }
}

/// `if (i + 1) % 0 == 0:` raises Python's error (it panicked on dividing
/// the loop's count by zero).
#[test]
fn accumulating_every_zero_steps_is_a_zero_division() {
    let source = format!(
        "{DATA}{MLP}\nopt = torch.optim.Adam(model.parameters())\n\
for x, y in loader:\n    loss = F.cross_entropy(model(x), y)\n    loss.backward()\n    if (i + 1) % 0 == 0:\n        opt.step()\n        opt.zero_grad()\n"
    );
    let err = error(&source, Framework::Pytorch);
    assert!(err.message.contains("ZeroDivisionError"), "{}", err.message);
}

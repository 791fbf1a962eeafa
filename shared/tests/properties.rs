//! Property tests: the allocators' invariants and the runtime's,
//! checked after every command of random command sequences, for every
//! allocator; and no input, however malformed, makes the engine panic.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use vramlab_shared::alloc::caching::{allocation_size, round_size};
use vramlab_shared::command::{self, Command, RestartSettings};
use vramlab_shared::snapshot::Stats;
use vramlab_shared::train::kinds::Attention;
use vramlab_shared::types::Category;
use vramlab_shared::units::{format_size, GIB, MIB};
use vramlab_shared::Engine;
use vramlab_shared::{ErrorKind, Framework};

const NAMES: [&str; 6] = ["a", "b", "c", "d", "h", "k"];

/// The model kinds (the transformer and the CNN are PyTorch's only).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Mlp,
    Transformer,
    Cnn,
}

impl Kind {
    /// The model named `m`: `layers` layers or blocks `width` wide.
    fn model(self, layers: u32, width: u64, keras: bool) -> command::ModelArgs {
        let mlp = command::ModelArgs::mlp("m", layers, width);
        match self {
            Kind::Mlp => command::ModelArgs {
                input_dim: 256,
                keras,
                ..mlp
            },
            Kind::Transformer => command::ModelArgs {
                kind: command::ModelKind::Transformer,
                heads: Some(2),
                seq_len: Some(16),
                vocab: Some(64),
                ..mlp
            },
            Kind::Cnn => command::ModelArgs {
                kind: command::ModelKind::Cnn,
                channels: Some(1),
                image_size: Some(8),
                ..mlp
            },
        }
    }

    /// A dataset's (features, classes) for this kind.
    fn data(self) -> (u64, u64) {
        match self {
            Kind::Mlp => (256, 10),
            Kind::Transformer => (16, 64),
            Kind::Cnn => (64, 10),
        }
    }

    /// Fused attention, for a transformer when `fused`.
    fn attention(self, fused: bool) -> Attention {
        match (self, fused) {
            (Kind::Transformer, true) => Attention::Sdpa,
            _ => Attention::Eager,
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize, u64),
    Del(usize),
    Hold(usize, Vec<usize>, bool),
    /// `a = b`
    Assign(usize, usize),
    /// `a.append(b)`
    Append(usize, usize),
    Gc,
    EmptyCache,
    ClearSession,
    ResetPeaks,
    Restart(u64),
    /// Training: a model of a kind with (layers, width), then
    /// forward/backward/step/train.
    Model(Kind, u32, u64),
    Forward(usize, u64),
    Backward(usize),
    Step,
    Train(u64, bool),
}

/// Sizes from 1 B to 1 GiB, spread evenly over the orders of magnitude.
fn size() -> impl Strategy<Value = u64> {
    (0u32..30, any::<u64>()).prop_map(|(bits, r)| {
        let lo = 1u64 << bits;
        lo + r % lo
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..NAMES.len(), size()).prop_map(|(n, s)| Op::Alloc(n, s)),
        4 => (0..NAMES.len()).prop_map(Op::Del),
        2 => (0..NAMES.len(), prop::collection::vec(0..NAMES.len(), 0..4), any::<bool>())
            .prop_map(|(n, items, cycle)| Op::Hold(n, items, cycle)),
        2 => (0..NAMES.len(), 0..NAMES.len()).prop_map(|(a, b)| Op::Assign(a, b)),
        2 => (0..NAMES.len(), 0..NAMES.len()).prop_map(|(a, b)| Op::Append(a, b)),
        1 => Just(Op::Gc),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ClearSession),
        1 => Just(Op::ResetPeaks),
        // Small devices make OOMs frequent.
        1 => prop_oneof![Just(512 * MIB), Just(GIB), Just(3 * GIB), Just(16 * GIB)].prop_map(Op::Restart),
        1 => (prop_oneof![2 => Just(Kind::Mlp), 1 => Just(Kind::Transformer), 1 => Just(Kind::Cnn)], 1u32..4, prop_oneof![Just(8u64), Just(512), Just(4096)])
            .prop_map(|(k, l, w)| Op::Model(k, l, w)),
        1 => (0..NAMES.len(), prop_oneof![Just(1u64), Just(64), Just(8192)]).prop_map(|(n, b)| Op::Forward(n, b)),
        1 => (0..NAMES.len()).prop_map(Op::Backward),
        1 => Just(Op::Step),
        1 => (1u64..3, any::<bool>()).prop_map(|(s, t)| Op::Train(s, t)),
    ]
}

fn restart(framework: Framework, total: u64, variant: u8) -> Command {
    let mut s = RestartSettings {
        framework: Some(framework),
        device_total_bytes: Some(total),
        context_bytes: Some(300 * MIB),
        other_processes_bytes: Some(if variant & 4 != 0 { 64 * MIB } else { 0 }),
        ..Default::default()
    };
    match framework {
        Framework::Pytorch => {
            s.no_caching = Some(variant & 8 != 0);
            s.expandable_segments = Some(variant & 16 != 0);
            s.max_split_size_mb = Some((variant & 1 != 0).then_some(64));
            s.per_process_memory_fraction = Some((variant & 2 != 0).then_some(0.6));
            s.garbage_collection_threshold = Some(if variant & 2 != 0 { 0.5 } else { 0.0 });
        }
        Framework::Tensorflow => {
            s.allow_growth = Some(variant & 1 != 0);
            s.memory_limit_bytes = Some((variant & 2 != 0).then_some(total / 2));
        }
        Framework::Jax => {
            s.preallocate = Some(variant & 1 != 0);
            s.mem_fraction = Some(if variant & 2 != 0 { 0.5 } else { 0.75 });
        }
    }
    Command::Restart(s)
}

fn command(op: &Op, framework: Framework, variant: u8, kind: Kind) -> Command {
    match op {
        Op::Alloc(n, bytes) => Command::Alloc(command::AllocArgs {
            name: NAMES[*n].into(),
            bytes: Some(*bytes),
            shape: None,
            dtype: None,
            category: None,
        }),
        Op::Del(n) => Command::Del(command::NameArgs {
            name: NAMES[*n].into(),
        }),
        Op::Hold(n, items, cycle) => Command::Hold(command::HoldArgs {
            name: NAMES[*n].into(),
            items: items.iter().map(|&i| NAMES[i].to_string()).collect(),
            cycle: *cycle,
        }),
        Op::Assign(a, b) => Command::Assign(command::AssignArgs {
            name: NAMES[*a].into(),
            value: NAMES[*b].into(),
        }),
        Op::Append(a, b) => Command::Append(command::AppendArgs {
            name: NAMES[*a].into(),
            item: NAMES[*b].into(),
        }),
        Op::Gc => Command::Gc {},
        Op::EmptyCache => Command::EmptyCache {},
        Op::ClearSession => Command::ClearSession {},
        Op::ResetPeaks => Command::ResetPeakMemoryStats {},
        Op::Restart(total) => restart(framework, *total, variant),
        Op::Model(kind, layers, width) => {
            Command::Model(kind.model(*layers, *width, variant & 1 != 0))
        }
        Op::Forward(n, batch) => Command::Forward(command::ForwardArgs {
            name: NAMES[*n].into(),
            model: "m".into(),
            data: "d".into(),
            batch_size: *batch,
            no_grad: *batch == 1,
            amp: amp(variant),
            checkpointing: variant & 4 != 0,
            attention: kind.attention(variant & 2 != 0),
            batch: None,
        }),
        Op::Backward(n) => Command::Backward(command::BackwardArgs {
            name: NAMES[*n].into(),
            retain_graph: variant & 1 != 0,
        }),
        Op::Step => Command::Step(command::StepArgs {
            optimizer: "o".into(),
        }),
        Op::Train(steps, tensor_history) => Command::Train(command::TrainArgs {
            model: "m".into(),
            optimizer: "o".into(),
            data: "d".into(),
            steps: *steps,
            batch_size: 32,
            accumulate: if *tensor_history { 2 } else { 1 },
            checkpointing: variant & 4 != 0,
            amp: amp(variant),
            set_to_none: !*tensor_history,
            donate: variant & 8 != 0,
            loss_history: if *tensor_history {
                command::LossHistory::Tensor
            } else {
                command::LossHistory::Item
            },
            attention: kind.attention(variant & 2 != 0),
            jit_compile: variant & 16 == 0,
        }),
    }
}

/// The stats that describe memory (the per-command peaks start anew with
/// every command).
fn state(s: &vramlab_shared::Stats) -> vramlab_shared::Stats {
    vramlab_shared::Stats {
        step_peak_allocated_bytes: 0,
        step_peak_reserved_bytes: 0,
        ..s.clone()
    }
}

fn check_sequence(framework: Framework, variant: u8, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut e = Engine::new_simulated();
    e.set_event_capacity(0);
    e.execute(&restart(framework, GIB, variant))
        .map_err(|err| TestCaseError::fail(err.message))?;
    let caching = framework == Framework::Pytorch && variant & 8 == 0;
    let default_caching = caching && variant & 3 == 0;
    let mut kind = Kind::Mlp;
    for op in ops {
        let before = e.stats();
        let cmd = command(op, framework, variant, kind);
        let result = e.execute(&cmd);
        if let (Op::Model(k, ..), true) = (op, result.is_ok()) {
            kind = *k;
            // Every model comes with an optimizer and a dataset.
            let optimizer = [
                vramlab_shared::train::OptimizerKind::Sgd,
                vramlab_shared::train::OptimizerKind::Momentum,
                vramlab_shared::train::OptimizerKind::Adam,
            ][usize::from(variant) % 3];
            let _ = e.execute(&Command::Optimizer(command::OptimizerArgs {
                name: "o".into(),
                model: "m".into(),
                kind: optimizer,
                lr: None,
                bits: 32,
            }));
            let (features, classes) = kind.data();
            let _ = e.execute(&Command::Data(command::DataArgs {
                name: "d".into(),
                samples: 1000,
                features,
                classes,
                on_device: variant & 4 != 0 && kind == Kind::Mlp,
            }));
        }
        let after = e.stats();
        if let Err(msg) = e.check_invariants() {
            return Err(TestCaseError::fail(format!("after {cmd:?}: {msg}")));
        }
        let restarted = matches!(op, Op::Restart(_)) && result.is_ok();
        if !restarted {
            // Peaks are monotone between resets and never below current.
            if !matches!(op, Op::ResetPeaks) {
                prop_assert!(after.peak_allocated_bytes >= before.peak_allocated_bytes);
                prop_assert!(after.peak_reserved_bytes >= before.peak_reserved_bytes);
            }
            prop_assert!(after.peak_allocated_bytes >= after.allocated_bytes);
            prop_assert!(after.peak_reserved_bytes >= after.reserved_bytes);
            prop_assert_eq!(after.context_bytes, before.context_bytes);
        }
        match &result {
            Err(err) if err.kind == ErrorKind::OutOfMemory => {
                if caching {
                    prop_assert_eq!(after.num_ooms, before.num_ooms + 1);
                    // "Tried to allocate" shows the segment size.
                    if let Op::Alloc(_, bytes) = op {
                        let shown =
                            format_size(allocation_size(round_size(*bytes, &Default::default())));
                        prop_assert!(
                            err.message.contains(&format!("Tried to allocate {shown}.")),
                            "{}",
                            err.message
                        );
                    }
                }
                if default_caching && matches!(op, Op::Alloc(..)) {
                    // Exactly one release-and-retry before the OOM.
                    prop_assert_eq!(after.num_alloc_retries, before.num_alloc_retries + 1);
                }
                if matches!(op, Op::Alloc(..)) {
                    // A failed `x = torch.empty(...)` binds nothing. (A failed
                    // training step leaves `last_exception` holding its frame;
                    // TensorFlow's first op keeps its scratch buffer, a
                    // workspace, even when its output does not fit.)
                    let tensors = |s: &Stats| {
                        let workspace = s.categories.get(&Category::Workspace).copied();
                        s.allocated_bytes.saturating_sub(workspace.unwrap_or(0))
                    };
                    prop_assert_eq!(tensors(&after), tensors(&before));
                }
            }
            Err(_) => prop_assert_eq!(state(&after), state(&before)),
            Ok(_) => {}
        }
        if framework != Framework::Pytorch && !restarted {
            // BFC: the pool only shrinks through garbage collection.
            prop_assert!(
                after.reserved_bytes >= before.reserved_bytes
                    || after.num_device_free > before.num_device_free
            );
        }
        if caching && matches!(op, Op::EmptyCache) {
            // No entirely free segment survives empty_cache.
            let snap = e.snapshot(0);
            for seg in &snap.segments {
                prop_assert!(
                    seg.allocated_size > 0,
                    "a free segment survived empty_cache"
                );
            }
        }
    }
    Ok(())
}

fn config() -> ProptestConfig {
    let cases = std::env::var("VRAMLAB_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn pytorch_caching_allocator_invariants(variant in 0u8..8, ops in prop::collection::vec(op(), 1..60)) {
        check_sequence(Framework::Pytorch, variant, &ops)?;
    }

    #[test]
    fn pytorch_expandable_segments_invariants(variant in 16u8..24, ops in prop::collection::vec(op(), 1..60)) {
        check_sequence(Framework::Pytorch, variant, &ops)?;
    }

    #[test]
    fn pytorch_uncached_invariants(variant in 8u8..16, ops in prop::collection::vec(op(), 1..60)) {
        check_sequence(Framework::Pytorch, variant, &ops)?;
    }

    #[test]
    fn tensorflow_bfc_invariants(variant in 0u8..8, ops in prop::collection::vec(op(), 1..60)) {
        check_sequence(Framework::Tensorflow, variant, &ops)?;
    }

    #[test]
    fn jax_bfc_invariants(variant in 0u8..8, ops in prop::collection::vec(op(), 1..60)) {
        check_sequence(Framework::Jax, variant, &ops)?;
    }
}

/// Arbitrary JSON values, nested.
fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        "[a-z_]{0,12}".prop_map(serde_json::Value::from),
        prop::sample::select(vec![
            "alloc",
            "del",
            "hold",
            "gc",
            "empty_cache",
            "clear_session",
            "restart",
            "pytorch",
            "tensorflow",
            "jax",
            "x",
            "float32",
        ])
        .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "cmd",
                    "name",
                    "bytes",
                    "shape",
                    "dtype",
                    "items",
                    "cycle",
                    "framework",
                    "device_total_bytes",
                    "context_bytes",
                    "allow_growth",
                    "memory_limit_bytes",
                    "preallocate",
                    "mem_fraction",
                    "expect",
                    "say",
                    "category",
                    "zzz",
                ]),
                inner,
                0..5,
            )
            .prop_map(|m| serde_json::Value::Object(
                m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
            )),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut e = Engine::new_simulated();
        let line = String::from_utf8_lossy(&bytes);
        let record = e.run_line(&line);
        prop_assert!(record.ok || record.error.is_some());
        prop_assert!(e.check_invariants().is_ok());
    }

    #[test]
    fn arbitrary_json_never_panics(values in prop::collection::vec(json(), 1..8)) {
        let mut e = Engine::new_simulated();
        for v in values {
            let record = e.run_line(&v.to_string());
            if let Some(err) = &record.error {
                prop_assert!(!err.message.is_empty());
            }
            if let Err(msg) = e.check_invariants() {
                return Err(TestCaseError::fail(format!("after {v}: {msg}")));
            }
        }
    }
}

/// Autocast off, or to float16 or bfloat16, by the variant's bits.
fn amp(variant: u8) -> command::Amp {
    match (variant & 2 != 0, variant & 1 != 0) {
        (false, _) => command::Amp::Off,
        (true, false) => command::Amp::Float16,
        (true, true) => command::Amp::Bfloat16,
    }
}

use super::*;
use crate::device::{SimDevice, SimDeviceConfig};
use crate::protocol::StepRecord;
use crate::snapshot::EventAction;
use crate::types::Category;
use crate::units::MIB;

fn run(engine: &mut Engine, line: &str) -> StepRecord {
    let r = engine.run_line(line);
    engine.check_invariants().unwrap();
    r
}

#[test]
fn del_vs_empty_cache_vs_context() {
    let mut e = Engine::new_simulated();
    let r = run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":67108864}"#);
    assert!(r.ok);
    assert_eq!(r.stats.allocated_bytes, 64 * MIB);
    assert_eq!(r.stats.device_used_bytes, 364 * MIB);
    let r = run(&mut e, r#"{"cmd":"del","name":"x"}"#);
    assert_eq!(r.stats.allocated_bytes, 0);
    assert_eq!(r.stats.reserved_bytes, 64 * MIB);
    let r = run(&mut e, r#"{"cmd":"empty_cache"}"#);
    assert_eq!(r.stats.reserved_bytes, 0);
    assert_eq!(r.stats.device_used_bytes, 300 * MIB);
    assert_eq!(r.step, 2);
}

#[test]
fn errors_change_nothing() {
    let mut e = Engine::new_simulated();
    run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1000}"#);
    run(
        &mut e,
        r#"{"cmd":"model","name":"m","layers":1,"width":8,"input_dim":4,"classes":2}"#,
    );
    let before = e.snapshot(usize::MAX);
    for line in [
        "not json",
        r#"{"cmd":"del","name":"nope"}"#,
        r#"{"cmd":"alloc","name":"9x","bytes":1}"#,
        r#"{"cmd":"alloc","name":"y","bytes":2305843009213693952}"#,
        r#"{"cmd":"alloc","name":"y","shape":[4294967296,4294967296,16]}"#,
        r#"{"cmd":"hold","name":"h","items":["x","ghost"]}"#,
        r#"{"cmd":"restart","mem_fraction":7}"#,
        r#"{"cmd":"optimizer","name":"o","model":"x","kind":"adam"}"#,
        r#"{"cmd":"model","name":"m2","layers":0}"#,
        r#"{"cmd":"train","model":"m","optimizer":"nope","data":"nope"}"#,
        r#"{"cmd":"close","name":"x"}"#,
    ] {
        let r = run(&mut e, line);
        assert!(!r.ok, "{line}");
        let mut after = e.snapshot(usize::MAX);
        after.step = before.step;
        after.stats.step_peak_allocated_bytes = before.stats.step_peak_allocated_bytes;
        after.stats.step_peak_reserved_bytes = before.stats.step_peak_reserved_bytes;
        assert_eq!(after, before, "{line}");
    }
}

#[test]
fn name_error_text_is_pythons() {
    let mut e = Engine::new_simulated();
    let r = run(&mut e, r#"{"cmd":"del","name":"x"}"#);
    let err = r.error.unwrap();
    assert_eq!(err.kind, ErrorKind::NameError);
    assert_eq!(err.message, "name 'x' is not defined");
}

#[test]
fn events_are_tagged_with_their_step() {
    let mut e = Engine::new_simulated();
    run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1000}"#);
    run(&mut e, r#"{"cmd":"del","name":"x"}"#);
    run(&mut e, r#"{"cmd":"empty_cache"}"#);
    let ev: Vec<(u64, EventAction, Option<String>)> = e
        .events_since(0)
        .map(|e| (e.step, e.action, e.name.clone()))
        .collect();
    assert_eq!(
        ev,
        vec![
            (0, EventAction::SegmentAlloc, None),
            (0, EventAction::Alloc, Some("x".into())),
            (1, EventAction::Free, Some("x".into())),
            (2, EventAction::SegmentFree, None),
        ]
    );
}

#[test]
fn snapshot_names_owners_and_chains() {
    let mut e = Engine::new_simulated();
    run(
        &mut e,
        r#"{"cmd":"alloc","name":"x","shape":[1024,1024],"dtype":"float32","category":"activation"}"#,
    );
    run(
        &mut e,
        r#"{"cmd":"hold","name":"h","items":["x"],"cycle":true}"#,
    );
    run(&mut e, r#"{"cmd":"del","name":"x"}"#);
    let s = e.snapshot(100);
    assert_eq!(s.stats.categories[&Category::Activation], 4 * MIB);
    let owner = s.segments[0].blocks[0].owner.clone();
    assert_eq!(owner.as_deref(), Some("x"));
    let x = s.objects.iter().find(|o| o.label == "x").unwrap();
    assert_eq!(x.kept_alive_by, "name `h` -> list `h`");
    assert_eq!(x.refcount, 1);
}

#[test]
fn reset_peak_memory_stats_brings_peaks_down_to_current() {
    let mut e = Engine::new_simulated();
    run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":67108864}"#);
    run(&mut e, r#"{"cmd":"del","name":"x"}"#);
    let r = run(&mut e, r#"{"cmd":"empty_cache"}"#);
    assert_eq!(r.stats.peak_allocated_bytes, 64 * MIB);
    let r = run(&mut e, r#"{"cmd":"reset_peak_memory_stats"}"#);
    assert_eq!(r.stats.peak_allocated_bytes, 0);
    assert_eq!(r.stats.peak_reserved_bytes, 0);
}

#[test]
fn del_model_keeps_parameters_the_optimizer_holds() {
    let mut e = Engine::new_simulated();
    run(
        &mut e,
        r#"{"cmd":"model","name":"m","layers":1,"width":1024,"input_dim":1024,"classes":10}"#,
    );
    let built = e.stats().allocated_bytes;
    run(
        &mut e,
        r#"{"cmd":"optimizer","name":"opt","model":"m","kind":"sgd"}"#,
    );
    let r = run(&mut e, r#"{"cmd":"del","name":"m"}"#);
    assert_eq!(r.stats.allocated_bytes, built);
    assert!(r.note.unwrap().contains("optimizer `opt`"));
    let r = run(&mut e, r#"{"cmd":"del","name":"opt"}"#);
    assert_eq!(r.stats.allocated_bytes, 0);
}

/// A GPU whose driver fails every allocation with an error that is not an
/// out-of-memory.
struct BrokenDriver(SimDevice);

impl Device for BrokenDriver {
    fn malloc(&mut self, _bytes: u64) -> Result<u64, crate::DeviceError> {
        Err(crate::DeviceError::Driver(
            "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        ))
    }
    fn free(&mut self, address: u64, bytes: u64) {
        self.0.free(address, bytes);
    }
    fn mem_get_info(&self) -> (u64, u64) {
        self.0.mem_get_info()
    }
    fn context_bytes(&self) -> u64 {
        self.0.context_bytes()
    }
    fn other_processes_bytes(&self) -> u64 {
        self.0.other_processes_bytes()
    }
    fn segment_bytes(&self) -> u64 {
        self.0.segment_bytes()
    }
    fn info(&self) -> DeviceInfo {
        self.0.info()
    }
}

struct BrokenDriverFactory;

impl DeviceFactory for BrokenDriverFactory {
    fn start(&mut self, _settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        Ok(Box::new(BrokenDriver(SimDevice::new(
            SimDeviceConfig::default(),
        ))))
    }
}

#[test]
fn a_driver_failure_is_a_device_error_not_an_out_of_memory() {
    let mut e = Engine::new(Box::new(BrokenDriverFactory), Settings::default()).unwrap();
    let r = e.run_line(r#"{"cmd":"alloc","name":"x","bytes":1024}"#);
    let err = r.error.unwrap();
    assert_eq!(err.kind, ErrorKind::DeviceError);
    assert_eq!(err.message, "CUDA error: CUDA_ERROR_ILLEGAL_ADDRESS");
    assert_eq!(r.stats.num_ooms, 0);
    assert_eq!(r.stats.allocated_bytes, 0);
    assert!(e.process().runtime.lookup("x").is_none());
}

/// Regions of 128 and 256 MiB (growth doubles: `Extend`), both free again,
/// and a 400 MiB request whose 512 MiB region does not fit beside them
/// under a 768 MiB limit. (TensorFlow's first region, 2 MiB, holds its
/// scratch buffer and stays.) TensorFlow's BFC gives free
/// regions back and retries (`TF_ENABLE_GPU_GARBAGE_COLLECTION`, on by
/// default); XLA's, under JAX, has no garbage collection
/// (`xla/pjrt/gpu/gpu_helpers.cc` sets only `allow_growth`).
#[test]
fn only_tensorflow_returns_free_regions_to_make_room() {
    let play = |framework: &str| {
        let mut e = Engine::new_simulated();
        let restart = format!(
            r#"{{"cmd":"restart","framework":"{framework}","device_total_bytes":1073741824,"context_bytes":0,"allow_growth":true,"preallocate":false,"memory_limit_bytes":805306368}}"#
        );
        assert!(run(&mut e, &restart).ok);
        for line in [
            r#"{"cmd":"alloc","name":"a","bytes":104857600}"#,
            r#"{"cmd":"alloc","name":"b","bytes":209715200}"#,
            r#"{"cmd":"del","name":"a"}"#,
            r#"{"cmd":"del","name":"b"}"#,
        ] {
            assert!(run(&mut e, line).ok, "{line}");
        }
        run(&mut e, r#"{"cmd":"alloc","name":"c","bytes":419430400}"#)
    };
    let tf = play("tensorflow");
    assert!(tf.ok, "{:?}", tf.error);
    assert_eq!(tf.stats.reserved_bytes, (2 + 512) * MIB);
    let jax = play("jax");
    assert_eq!(jax.error.map(|e| e.kind), Some(ErrorKind::OutOfMemory));
    // 2 MiB (jnp.zeros's first fill scalar) + 128 MiB + 256 MiB.
    assert_eq!(jax.stats.reserved_bytes, (2 + 384) * MIB);
}

/// `allocate` refuses 1 EiB (2^60 bytes) and more before the allocator sees
/// it; below that, the allocator answers (here: it does not fit).
#[test]
fn an_exabyte_is_refused_with_pytorchs_words_and_less_is_the_allocators_call() {
    let mut e = Engine::new_simulated();
    let r = run(
        &mut e,
        r#"{"cmd":"alloc","name":"x","bytes":1152921504606846976}"#,
    );
    let err = r.error.unwrap();
    assert_eq!(err.kind, ErrorKind::OutOfMemory);
    assert_eq!(
        err.message,
        "CUDA out of memory. Tried to allocate more than 1EB memory."
    );
    assert_eq!(r.stats.num_ooms, 0);
    let r = run(
        &mut e,
        r#"{"cmd":"alloc","name":"x","bytes":1152921504606846975}"#,
    );
    assert_eq!(r.error.unwrap().kind, ErrorKind::OutOfMemory);
    assert_eq!(r.stats.num_ooms, 1);
    for framework in ["tensorflow", "jax"] {
        let restart = format!(r#"{{"cmd":"restart","framework":"{framework}"}}"#);
        assert!(run(&mut e, &restart).ok);
        let r = run(
            &mut e,
            r#"{"cmd":"alloc","name":"x","bytes":1152921504606846975}"#,
        );
        assert_eq!(r.error.unwrap().kind, ErrorKind::OutOfMemory, "{framework}");
    }
}

/// `BaseGPUDevice::InitScratchBuffers`: TensorFlow's first op allocates
/// 1,028 bytes (1,280 in the BFC pool) before its output, for good; with
/// `allow_growth` it takes the first 2 MiB region, and a 1 MiB tensor gets
/// the rest of it whole (2,095,872 bytes: less than twice the request, so
/// the chunk is not split).
#[test]
fn tensorflows_first_op_allocates_the_eigen_scratch_buffer_first() {
    let mut e = Engine::new_simulated();
    let restart = r#"{"cmd":"restart","framework":"tensorflow","allow_growth":true}"#;
    assert!(run(&mut e, restart).ok);
    let r = run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1048576}"#);
    assert_eq!(r.stats.allocated_bytes, 2 * MIB);
    assert_eq!(r.stats.requested_bytes, MIB + 1028);
    assert_eq!(r.stats.reserved_bytes, 2 * MIB);
    assert_eq!(r.stats.categories[&Category::Workspace], 1280);
    let r = run(&mut e, r#"{"cmd":"del","name":"x"}"#);
    assert_eq!(r.stats.allocated_bytes, 1280);
    let snap = e.snapshot(0);
    let first = &snap.segments[0].blocks[0];
    assert_eq!(
        first.owner.as_deref(),
        Some("Eigen scratch buffer (GPU device)")
    );
    // JAX has no such buffer.
    assert!(
        run(
            &mut e,
            r#"{"cmd":"restart","framework":"jax","preallocate":false}"#
        )
        .ok
    );
    // jnp.zeros's two fill scalars take the 2 MiB region's first 512
    // bytes; the output takes the rest whole, unsplit (as on an H100:
    // tests/golden/04-jax-preallocation.jax.jsonl, step 7).
    let r = run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1048576}"#);
    assert_eq!(r.stats.allocated_bytes, 2 * MIB - 512);
}

/// A step whose FLOP count does not fit in 64 bits used to wrap to a small
/// number and ask the CPU arithmetic for terabytes (the process aborted);
/// it runs shape-only now. On a 1 PiB device: a 1-layer float16 model of
/// width 10^6 on 262,144 inputs, and a no-grad forward at batch 1.2 x 10^7.
#[test]
fn a_step_too_large_to_count_runs_shape_only() {
    let mut e = Engine::new_simulated();
    for line in [
        r#"{"cmd":"restart","device_total_bytes":1125899906842624}"#,
        r#"{"cmd":"model","name":"m","layers":1,"width":1000000,"input_dim":262144,"dtype":"float16"}"#,
        r#"{"cmd":"data","name":"d","features":262144,"samples":12000000}"#,
    ] {
        assert!(run(&mut e, line).ok, "{line}");
    }
    let spec = e.train.models.values().next().unwrap().spec;
    let program = spec.step_program(12_000_000, Default::default());
    let flops = e.program_arithmetic(&spec, &program).unwrap_err().unwrap();
    assert!(flops > 10_000_000_000_000_000_000, "{flops}");
    let r = run(
        &mut e,
        r#"{"cmd":"forward","name":"loss","model":"m","data":"d","batch_size":12000000,"no_grad":true}"#,
    );
    assert_eq!(r.value.unwrap()["loss"], serde_json::Value::Null);
}

/// With no FLOP limit, the host memory the arithmetic would need still
/// caps it: a 4-wide MLP computes at batch 10^6 (a few MB of values) and
/// runs shape-only at 1.6 x 10^7 (its float32 values at their peak pass 256
/// MiB).
#[test]
fn a_step_too_large_for_host_memory_runs_shape_only() {
    let mut e = Engine::new_simulated();
    e.set_arithmetic_flop_limit(u64::MAX);
    for line in [
        r#"{"cmd":"restart","device_total_bytes":1125899906842624}"#,
        r#"{"cmd":"model","name":"m","layers":1,"width":4,"input_dim":1,"classes":2}"#,
        r#"{"cmd":"data","name":"d","features":1,"classes":2,"samples":16000000}"#,
    ] {
        assert!(run(&mut e, line).ok, "{line}");
    }
    let forward = |batch: u64| {
        format!(
            r#"{{"cmd":"forward","name":"loss","model":"m","data":"d","batch_size":{batch},"no_grad":true}}"#
        )
    };
    let r = run(&mut e, &forward(1_000_000));
    assert!(r.value.unwrap()["loss"].is_number());
    let r = run(&mut e, &forward(16_000_000));
    assert_eq!(r.value.unwrap()["loss"], serde_json::Value::Null);
}

/// `train` with `accumulate` and `batch_size` at 2^64 - 1 used to run
/// forever: steps x accumulate is bounded, and a stop is honoured between
/// micro-batches, not only between steps.
#[test]
fn training_is_bounded_and_stops_between_micro_batches() {
    let mut e = Engine::new_simulated();
    for line in [
        r#"{"cmd":"model","name":"m","layers":1,"width":16,"input_dim":8}"#,
        r#"{"cmd":"optimizer","name":"o","model":"m","kind":"sgd"}"#,
        r#"{"cmd":"data","name":"d","features":8,"samples":100}"#,
    ] {
        assert!(run(&mut e, line).ok, "{line}");
    }
    let r = run(
        &mut e,
        r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","batch_size":18446744073709551615,"accumulate":18446744073709551615}"#,
    );
    let err = r.error.unwrap();
    assert_eq!(err.kind, ErrorKind::InvalidValue);
    assert!(
        err.message.contains("at most 1000000 micro-batches"),
        "{}",
        err.message
    );
    // Stop at the first chance: after the first of 50 micro-batches.
    use std::sync::atomic::{AtomicU32, Ordering};
    let calls = std::sync::Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    e.set_progress_hook(Some(Box::new(move |_: &mut Engine, _: &Progress| {
        seen.fetch_add(1, Ordering::SeqCst);
        false
    })));
    let before = e.stats().allocated_bytes;
    let r = run(
        &mut e,
        r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","steps":3,"batch_size":50,"accumulate":50}"#,
    );
    assert!(r.ok);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let value = r.value.unwrap();
    assert_eq!(value["stopped"], true);
    // The abandoned step's frame is gone; its gradients (one micro-batch's)
    // and the bound batch stay, as after an interrupted Python loop.
    assert!(r.stats.allocated_bytes > before);
}

/// Eager TensorFlow runs `tf.zeros` as a wrapped `Fill` function: its OOM
/// names the function node and the op around the allocator's words.
#[test]
fn tensorflows_eager_oom_is_framed_by_its_op() {
    let mut e = Engine::new_simulated();
    let restart = r#"{"cmd":"restart","framework":"tensorflow","device_total_bytes":1073741824,"context_bytes":0}"#;
    assert!(run(&mut e, restart).ok);
    let r = run(
        &mut e,
        r#"{"cmd":"alloc","name":"x","shape":[512,1024,1024],"dtype":"float32"}"#,
    );
    let err = r.error.unwrap();
    assert_eq!(err.kind, ErrorKind::OutOfMemory);
    assert_eq!(
        err.message,
        "{{function_node __wrapped__Fill_device_/job:localhost/replica:0/task:0/device:GPU:0}} OOM when allocating tensor with shape[512,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:Fill] name: "
    );
}

/// A long run's result keeps the first and the last 500 steps: 1,500 steps
/// give 1,000 records and say 500 were left out.
#[test]
fn a_long_runs_result_keeps_the_first_and_last_steps() {
    let mut e = Engine::new_simulated();
    for line in [
        r#"{"cmd":"model","name":"m","layers":1,"width":8,"input_dim":4}"#,
        r#"{"cmd":"optimizer","name":"o","model":"m","kind":"sgd"}"#,
        r#"{"cmd":"data","name":"d","features":4,"samples":100}"#,
    ] {
        assert!(run(&mut e, line).ok, "{line}");
    }
    let r = run(
        &mut e,
        r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","steps":1500,"batch_size":4}"#,
    );
    let value = r.value.unwrap();
    let steps = value["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1000);
    assert_eq!(value["steps_omitted"], 500);
    assert_eq!(steps[499]["step"], 499);
    assert_eq!(steps[500]["step"], 1000);
    assert_eq!(steps[999]["step"], 1499);
    assert_eq!(value["last_loss"], steps[999]["loss"]);
}

/// A restart's result says what the new process runs with and on, so the
/// page and the server's hello follow a GPU model without asking again.
#[test]
fn a_restarts_result_carries_its_settings_and_device() {
    let mut e = Engine::new_simulated();
    let r = run(&mut e, r#"{"cmd":"restart","gpu":"h100-80gb"}"#);
    let device = r.device.unwrap();
    assert_eq!(device.name, "Simulated NVIDIA H100 80GB HBM3");
    assert_eq!(device.total_bytes, 85_017_493_504);
    assert_eq!(device.compute_capability, (9, 0));
    assert_eq!(
        r.settings.unwrap().gpu,
        Some(crate::gpu::GpuModel::H100_80gb)
    );
    let r = run(&mut e, r#"{"cmd":"gc"}"#);
    assert!(r.settings.is_none() && r.device.is_none());
}

/// `roundup_power2_divisions` as `PYTORCH_CUDA_ALLOC_CONF` writes its list
/// (`parseRoundUpPower2Divisions`): 33 MiB takes a 36 MiB block (8 steps
/// from 32 MiB), 5 MiB + 1 byte stays on plain 512-byte rounding; the
/// setting reads back as given and a bad list changes nothing.
#[test]
fn roundup_power2_divisions_takes_the_per_size_list() {
    let mut e = Engine::new_simulated();
    let r = run(
        &mut e,
        r#"{"cmd":"restart","roundup_power2_divisions":"[1:0,32:8]"}"#,
    );
    assert!(r.ok, "{:?}", r.error);
    let divisions = r.settings.unwrap().roundup_power2_divisions;
    assert_eq!(divisions.for_size(33 * MIB), 8);
    assert_eq!(divisions.for_size(5 * MIB), 0);
    let r = run(&mut e, r#"{"cmd":"alloc","name":"a","bytes":34603008}"#);
    assert_eq!(r.stats.allocated_bytes, 36 * MIB);
    let r = run(&mut e, r#"{"cmd":"alloc","name":"b","bytes":5242881}"#);
    assert_eq!(r.stats.allocated_bytes, 36 * MIB + 5 * MIB + 512);
    let r = run(
        &mut e,
        r#"{"cmd":"restart","roundup_power2_divisions":"[300:8]"}"#,
    );
    assert!(!r.ok);
    assert!(r
        .error
        .unwrap()
        .message
        .contains("intervals have to be power of 2"));
}

#[test]
fn assign_names_one_object_twice_and_append_makes_a_cycle() {
    let mut e = Engine::new_simulated();
    run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":67108864}"#);
    let r = run(&mut e, r#"{"cmd":"assign","name":"y","value":"x"}"#);
    assert_eq!(r.stats.allocated_bytes, 64 * MIB);
    assert_eq!(
        r.note.as_deref(),
        Some("`y` and `x` now name one object (2 references): nothing was allocated, and `del` of either frees nothing while the other lives.")
    );
    assert_eq!(
        run(&mut e, r#"{"cmd":"del","name":"x"}"#)
            .stats
            .allocated_bytes,
        64 * MIB
    );
    run(&mut e, r#"{"cmd":"hold","name":"h","items":["y"]}"#);
    run(&mut e, r#"{"cmd":"append","name":"h","item":"h"}"#);
    assert_eq!(
        run(&mut e, r#"{"cmd":"del","name":"y"}"#)
            .stats
            .allocated_bytes,
        64 * MIB
    );
    // The list holds itself: only the collector frees it.
    assert_eq!(
        run(&mut e, r#"{"cmd":"del","name":"h"}"#)
            .stats
            .allocated_bytes,
        64 * MIB
    );
    assert_eq!(run(&mut e, r#"{"cmd":"gc"}"#).stats.allocated_bytes, 0);
    let r = run(&mut e, r#"{"cmd":"alloc","name":"t","bytes":512}"#);
    assert!(r.ok);
    let r = run(&mut e, r#"{"cmd":"append","name":"t","item":"t"}"#);
    assert_eq!(
        r.error.map(|e| e.message),
        Some(
            "AttributeError: 'Tensor' object has no attribute 'append' (`t` is not a list)"
                .to_string()
        )
    );
}

/// A session holds at most `MAX_OBJECTS` objects (a command's cost grew
/// with them: a thousand commands at 16,000 live tensors took seconds);
/// past it a new tensor or list is refused, saying why, and `del` makes
/// room.
#[test]
fn a_kernel_holds_a_bounded_number_of_objects() {
    use crate::runtime::ObjectKind;
    let mut e = Engine::new_simulated();
    for i in 0..tensors::MAX_OBJECTS {
        let list = e.process.runtime.new_local(ObjectKind::List, "l");
        e.process.bind_local(&format!("l{i}"), list);
    }
    let refused = e.run_line(r#"{"cmd":"alloc","name":"x","bytes":512}"#);
    let err = refused.error.unwrap();
    assert!(
        err.message
            .starts_with("this kernel holds 50000 objects, the most vramlab keeps"),
        "{}",
        err.message
    );
    assert!(!e.run_line(r#"{"cmd":"hold","name":"h","items":[]}"#).ok);
    assert!(run(&mut e, r#"{"cmd":"del","name":"l0"}"#).ok);
    assert!(run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":512}"#).ok);
}

/// A batch that does not split into its micro-batches is refused with one
/// message, whichever command asks (it was checked three times, in three
/// words).
#[test]
fn a_batch_that_does_not_split_is_refused_alike_everywhere() {
    let mut e = Engine::new_simulated();
    for line in [
        r#"{"cmd":"model","name":"m"}"#,
        r#"{"cmd":"optimizer","name":"o","model":"m","kind":"adam"}"#,
        r#"{"cmd":"data","name":"d"}"#,
        r#"{"cmd":"model","name":"llm","kind":"hf","config":{"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":1000}}"#,
        r#"{"cmd":"optimizer","name":"lo","model":"llm","kind":"adamw"}"#,
        r#"{"cmd":"data","name":"tokens","samples":64,"features":32,"classes":1000}"#,
    ] {
        run(&mut e, line);
    }
    let said = "batch_size 10 does not split into 4 micro-batches: both are at least 1, and accumulate divides batch_size";
    for line in [
        r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","batch_size":10,"accumulate":4}"#,
        r#"{"cmd":"estimate","model":"m","optimizer":"o","data":"d","batch_size":10,"accumulate":4}"#,
        r#"{"cmd":"train","model":"llm","optimizer":"lo","data":"tokens","batch_size":10,"accumulate":4}"#,
    ] {
        let r = e.run_line(line);
        assert_eq!(r.error.map(|e| e.message).as_deref(), Some(said), "{line}");
    }
}

//! A step on a device that holds bytes (what a real GPU is to the
//! engine): every value written where the memory play placed it, every
//! operand read back and checked, the loss read back; the same numbers as
//! the CPU alone, and none at all when the device mixes tensors up.

use super::kinds_tests::{engine, gpt, run};
use super::*;
use crate::device::{Device, DeviceInfo, DeviceMemory, SimDevice, SimDeviceConfig};
use crate::error::DeviceError;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A simulated GPU whose segments hold bytes (zeros when allocated). An
/// access outside a live segment is refused, as the driver refuses an
/// illegal address. With `fold`, every address is taken modulo it inside
/// one buffer: a faulty device on which tensors overwrite each other.
pub(super) struct BytesDevice {
    sim: SimDevice,
    segments: BTreeMap<u64, Vec<u8>>,
    fold: Option<Vec<u8>>,
    accesses: Arc<AtomicU64>,
    pub(super) kernels: Option<super::on_device_compute_tests::Kernels>,
}

impl BytesDevice {
    fn span(&mut self, at: u64, len: usize) -> Result<&mut [u8], DeviceError> {
        self.accesses.fetch_add(1, Ordering::Relaxed);
        if let Some(buffer) = &mut self.fold {
            let start = (at % buffer.len() as u64) as usize;
            let end = (start + len).min(buffer.len());
            return Ok(&mut buffer[start..end]);
        }
        let illegal = || DeviceError::Driver(format!("illegal address {at:#x} (+{len})"));
        let (&base, bytes) = self
            .segments
            .range_mut(..=at)
            .next_back()
            .ok_or_else(illegal)?;
        let start = (at - base) as usize;
        bytes.get_mut(start..start + len).ok_or_else(illegal)
    }
}

impl DeviceMemory for BytesDevice {
    fn write(&mut self, address: u64, bytes: &[u8]) -> Result<(), DeviceError> {
        let span = self.span(address, bytes.len())?;
        let n = span.len();
        span.copy_from_slice(&bytes[..n]);
        Ok(())
    }

    fn read(&mut self, address: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        let span = self.span(address, out.len())?;
        out[..span.len()].copy_from_slice(span);
        Ok(())
    }

    fn compute(&mut self) -> Option<&mut dyn crate::compute::DeviceCompute> {
        self.kernels?;
        Some(self)
    }
}

impl Device for BytesDevice {
    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        let at = self.sim.malloc(bytes)?;
        // A device that computes starts each segment with NaN bytes, as a
        // GPU's memory holds whatever was there: a value read before it
        // is written shows.
        let fill = if self.kernels.is_some() { 0xff } else { 0 };
        self.segments.insert(at, vec![fill; bytes as usize]);
        Ok(at)
    }
    fn free(&mut self, address: u64, bytes: u64) {
        self.segments.remove(&address);
        self.sim.free(address, bytes);
    }
    fn mem_get_info(&self) -> (u64, u64) {
        self.sim.mem_get_info()
    }
    fn context_bytes(&self) -> u64 {
        self.sim.context_bytes()
    }
    fn other_processes_bytes(&self) -> u64 {
        self.sim.other_processes_bytes()
    }
    fn segment_bytes(&self) -> u64 {
        self.sim.segment_bytes()
    }
    fn info(&self) -> DeviceInfo {
        self.sim.info()
    }
    fn memory(&mut self) -> Option<&mut dyn DeviceMemory> {
        Some(self)
    }
    fn holds_values(&self) -> bool {
        true
    }
}

impl BytesDevice {
    /// A device of `total` bytes that computes as `kernels` says.
    pub(super) fn with(total: u64, kernels: super::on_device_compute_tests::Kernels) -> Self {
        BytesDevice {
            sim: SimDevice::new(SimDeviceConfig {
                total_bytes: total,
                ..SimDeviceConfig::default()
            }),
            segments: BTreeMap::new(),
            fold: None,
            accesses: Arc::new(AtomicU64::new(0)),
            kernels: Some(kernels),
        }
    }
}

struct BytesFactory {
    fold: Option<usize>,
    accesses: Arc<AtomicU64>,
    kernels: Option<super::on_device_compute_tests::Kernels>,
}

impl DeviceFactory for BytesFactory {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        Ok(Box::new(BytesDevice {
            sim: SimDevice::new(SimDeviceConfig {
                total_bytes: settings.device_total_bytes,
                ..SimDeviceConfig::default()
            }),
            segments: BTreeMap::new(),
            fold: self.fold.map(|n| vec![0; n]),
            accesses: self.accesses.clone(),
            kernels: self.kernels,
        }))
    }
}

/// `kinds_tests::engine`'s set-up, on a device that holds bytes; the
/// count of its accesses.
fn on_bytes(
    model: &Value,
    features: u64,
    classes: u64,
    fold: Option<usize>,
) -> (Engine, Arc<AtomicU64>) {
    on_device_with(model, (features, classes), fold, None)
}

/// [`on_bytes`] on a device that runs `kernels`.
pub(super) fn on_device_with(
    model: &Value,
    (features, classes): (u64, u64),
    fold: Option<usize>,
    kernels: Option<super::on_device_compute_tests::Kernels>,
) -> (Engine, Arc<AtomicU64>) {
    let accesses = Arc::new(AtomicU64::new(0));
    let factory = BytesFactory {
        fold,
        accesses: accesses.clone(),
        kernels,
    };
    let mut e = Engine::new(Box::new(factory), Settings::default()).unwrap();
    let mut m = json!({"cmd":"model","name":"model"});
    for (k, v) in model.as_object().unwrap() {
        m[k] = v.clone();
    }
    for line in [
        json!({"cmd":"restart","framework":"pytorch","device_total_bytes": 80u64 << 30}),
        m,
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        json!({"cmd":"data","name":"data","samples":4096,"features":features,"classes":classes}),
    ] {
        let r = run(&mut e, &line);
        assert!(r.ok, "{line}: {:?}", r.error);
    }
    (e, accesses)
}

pub(super) fn losses(e: &mut Engine, extra: &Value) -> Vec<Option<f64>> {
    let mut line = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":4,"batch_size":8});
    for (k, v) in extra.as_object().unwrap() {
        line[k] = v.clone();
    }
    let r = run(e, &line);
    assert!(r.ok, "{line}: {:?}", r.error);
    let value = r.value.unwrap();
    let steps = value["steps"].as_array().unwrap();
    steps.iter().map(|s| s["loss"].as_f64()).collect()
}

/// Every kind, with the techniques that change what is stored: float16
/// and bfloat16 values, recomputation, accumulation, a set on the device.
fn models() -> Vec<(Value, u64, u64, Value)> {
    let (gpt, features, classes) = gpt(1, 16, 2, 8, 32);
    let cnn = json!({"kind":"cnn","channels":2,"image_size":8,"blocks":2,"width":4,"classes":5});
    let mlp = json!({"kind":"mlp","layers":2,"width":32,"input_dim":16,"classes":4});
    vec![
        (gpt.clone(), features, classes, json!({})),
        (
            gpt,
            features,
            classes,
            json!({"amp":"float16","checkpointing":true}),
        ),
        (cnn, 2 * 8 * 8, 5, json!({})),
        (mlp.clone(), 16, 4, json!({"amp":"bfloat16"})),
        (mlp, 16, 4, json!({"accumulate":2})),
    ]
}

/// The device's values give the CPU's losses, to the bit (the loss read
/// back is the float the CPU wrote), for every kind and technique.
#[test]
fn a_step_on_a_device_that_holds_bytes_computes_what_the_cpu_computes() {
    for (model, features, classes, extra) in models() {
        let cpu = losses(
            &mut engine(model.clone(), "adam", features, classes),
            &extra,
        );
        let (mut e, accesses) = on_bytes(&model, features, classes, None);
        let before = accesses.load(Ordering::Relaxed);
        let device = losses(&mut e, &extra);
        assert!(cpu.iter().all(Option::is_some), "{model} {extra}: {cpu:?}");
        assert_eq!(device, cpu, "{model} {extra}");
        let used = accesses.load(Ordering::Relaxed) - before;
        assert!(used > 100, "{model} {extra}: {used} accesses");
    }
}

/// A set moved to the device: each batch is written where its rows are,
/// and the losses are the CPU's.
#[test]
fn a_dataset_on_the_device_gives_the_cpus_losses() {
    let mlp = json!({"kind":"mlp","layers":2,"width":32,"input_dim":16,"classes":4});
    let to_device =
        json!({"cmd":"data","name":"data","samples":64,"features":16,"classes":4,"on_device":true});
    let mut cpu = engine(mlp.clone(), "adam", 16, 4);
    let (mut e, _) = on_bytes(&mlp, 16, 4, None);
    for e in [&mut cpu, &mut e] {
        assert!(run(e, &to_device).ok);
    }
    let want = losses(&mut cpu, &json!({}));
    assert!(want.iter().all(Option::is_some));
    assert_eq!(losses(&mut e, &json!({})), want);
}

/// `forward`, `backward`, `step` one at a time on the device: the loss
/// read back is the CPU's, and each `.grad` on the device holds the
/// gradient the engine holds.
#[test]
fn statements_leave_their_gradients_on_the_device() {
    let (model, features, classes) = gpt(1, 16, 2, 8, 32);
    let mut cpu = engine(model.clone(), "adam", features, classes);
    let (mut e, _) = on_bytes(&model, features, classes, None);
    let forward =
        json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":8});
    for _ in 0..2 {
        let want = run(&mut cpu, &forward).value.unwrap()["loss"].clone();
        assert!(want.is_f64());
        assert_eq!(run(&mut e, &forward).value.unwrap()["loss"], want);
        for line in [
            json!({"cmd":"backward","name":"loss"}),
            json!({"cmd":"step","optimizer":"opt"}),
        ] {
            assert!(run(&mut cpu, &line).ok && run(&mut e, &line).ok, "{line}");
        }
        let state = e.train.models.values().next().unwrap().clone();
        assert_eq!(
            state.grad_values,
            cpu.train.models.values().next().unwrap().grad_values
        );
        for (&param, grad) in state.params.iter().zip(&state.grad_values) {
            let grad = grad.as_ref().expect("every parameter has a gradient");
            let at = crate::train::autograd::grad_of(&e.process, param)
                .and_then(|g| e.process.address(g))
                .unwrap();
            let mut bytes = vec![0u8; 4 * grad.len()];
            let memory = e.process.device.memory().unwrap();
            memory.read(at, &mut bytes).unwrap();
            let on_device: Vec<f32> = bytes
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(&on_device, grad);
        }
        assert!(run(&mut cpu, &json!({"cmd":"zero_grad","optimizer":"opt"})).ok);
        assert!(run(&mut e, &json!({"cmd":"zero_grad","optimizer":"opt"})).ok);
    }
}

/// A device on which tensors overwrite each other: an op's operand read
/// back is not what was written, so no loss is computed (rather than a
/// wrong one); memory is played all the same.
#[test]
fn a_device_that_mixes_tensors_up_computes_no_loss() {
    let (model, features, classes) = gpt(1, 16, 2, 8, 32);
    let (mut e, _) = on_bytes(&model, features, classes, Some(4096));
    let got = losses(&mut e, &json!({}));
    assert!(got.iter().all(Option::is_none), "{got:?}");
    let mut cpu = engine(model, "adam", features, classes);
    let line = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":4,"batch_size":8});
    let peak = |e: &mut Engine| run(e, &line).stats.peak_allocated_bytes;
    let (mut e, _) = on_bytes(&gpt(1, 16, 2, 8, 32).0, features, classes, Some(4096));
    assert_eq!(peak(&mut e), peak(&mut cpu));
}

/// The play records where everything went: each allocation with bytes at
/// an address inside a live segment, and each BLAS call's workspace
/// (PyTorch 2.15's per-call ones: allocated and freed by the call), in the
/// program's order.
#[test]
fn the_play_places_every_tensor_and_every_blas_workspace() {
    use super::program::{Player, Target};
    use crate::train::frame::PyFrame;
    use crate::train::kinds::step::{Op, Options};
    let (model, features, classes) = gpt(1, 16, 2, 8, 32);
    let (mut e, _) = on_bytes(&model, features, classes, None);
    let id = e.process.runtime.lookup("model").unwrap();
    let (spec, params) = {
        let state = &e.train.models[&id];
        (state.spec, state.params.clone())
    };
    let options = Options {
        accumulate: 1,
        ..Options::default()
    };
    let program = spec.step_program(8, options);
    let target = Target {
        name: "model",
        params: &params,
        loss: "loss",
        holder: None,
    };
    let mut frame = PyFrame::default();
    let mut player = Player::in_loop(&program);
    let all = 0..program.ops.len();
    let k = &mut e.process;
    player
        .play(k, &mut frame, &mut e.train.cublas, all, &target)
        .unwrap();
    let placement = player.placement;
    let blas: Vec<usize> = (program.ops.iter().enumerate())
        .filter(|(_, op)| matches!(op, Op::Blas(..)))
        .map(|(at, _)| at)
        .collect();
    let placed: Vec<usize> = placement.workspaces.iter().map(|w| w.0).collect();
    assert!(!blas.is_empty());
    assert_eq!(placed, blas);
    let memory = e.process.device.memory().unwrap();
    let mut byte = [0u8; 1];
    for &(_, at, bytes) in &placement.workspaces {
        assert!(bytes > 0);
        memory.read(at, &mut byte).unwrap();
        memory.read(at + bytes - 1, &mut byte).unwrap();
    }
    for (i, a) in program.allocs.iter().enumerate() {
        if a.bytes() > 0 {
            let at = placement.allocs[i].expect("a tensor with bytes is placed");
            memory.read(at + a.bytes() - 1, &mut byte).unwrap();
        }
    }
    assert_eq!(placement.params.len(), params.len());
    assert!(placement.params.iter().all(Option::is_some));
    frame.finish(&mut e.process);
}

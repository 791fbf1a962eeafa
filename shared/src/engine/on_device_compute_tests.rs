//! A step on a device that runs code: each op planned as kernels and
//! cuBLAS calls (`train::kernels`), launched on the addresses the play
//! gave, the device's value held to the CPU's, the loss read from the
//! device. The device here emulates the MLP's kernels and `GemmEx` in
//! Rust (the CNN's: `on_device_cnn_tests`; fused attention's:
//! `on_device_attention_tests`; the transformer's others:
//! `on_device_transformer_tests`; the CUDA source itself runs on
//! a GPU: `server/tests/gpu.rs`), so
//! what is tested is the plumbing: places, parts, workspaces, arguments,
//! and what a device that fails or computes nothing leads to.

use super::kinds_tests::engine;
use super::on_device::{decode, encode};
use super::on_device_tests::{losses, on_device_with, BytesDevice};
use crate::compute::{DeviceCompute, GemmEx, Grid, KernelArg as K, Launch};
use crate::device::DeviceMemory;
use crate::error::DeviceError;
use crate::types::Dtype;
use serde_json::json;

/// What the test device does when asked to run code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernels {
    /// Computes as the kernels would.
    Emulate,
    /// Every launch fails (as a kernel image the driver rejects).
    Refuse,
    /// Returns at once, computing nothing.
    Idle,
}

/// A launch's arguments as an emulated kernel reads them, by position.
pub(super) struct Args<'a>(pub &'a Launch);

impl Args<'_> {
    pub(super) fn int(&self, i: usize) -> usize {
        match self.0.args[i] {
            K::I64(v) => v as usize,
            K::I32(v) => v as usize,
            _ => panic!("{}: argument {i} is not an integer", self.0.kernel),
        }
    }

    pub(super) fn float(&self, i: usize) -> f32 {
        match self.0.args[i] {
            K::F32(v) => v,
            _ => panic!("{}: argument {i} is not a float", self.0.kernel),
        }
    }

    pub(super) fn ptr(&self, i: usize) -> u64 {
        match self.0.args[i] {
            K::Ptr(p) => p,
            _ => panic!("{}: argument {i} is not a pointer", self.0.kernel),
        }
    }

    /// A tensor: its address at `i`, its type code after it.
    pub(super) fn tensor(&self, i: usize) -> (u64, Dtype) {
        match self.0.args.get(i + 1) {
            Some(&K::I32(t)) => (self.ptr(i), dtype_of(t)),
            _ => panic!("{}: argument {i} is not a tensor", self.0.kernel),
        }
    }

    /// The blocks of a launch a row a block (0 for one over elements).
    pub(super) fn rows(&self) -> usize {
        match self.0.grid {
            Grid::Rows(r) => r as usize,
            Grid::Elements(_) => 0,
        }
    }
}

pub(super) fn dtype_of(code: i32) -> Dtype {
    [
        Dtype::Float32,
        Dtype::Float16,
        Dtype::Bfloat16,
        Dtype::Float64,
        Dtype::Int64,
        Dtype::Int32,
        Dtype::Int16,
        Dtype::Int8,
        Dtype::Uint8,
    ][code as usize]
}

impl BytesDevice {
    pub(super) fn get(&mut self, at: u64, dtype: Dtype, n: usize) -> Result<Vec<f32>, DeviceError> {
        let mut bytes = vec![0; n * dtype.size_bytes() as usize];
        self.read(at, &mut bytes)?;
        Ok(decode(dtype, &bytes))
    }

    pub(super) fn put(&mut self, at: u64, dtype: Dtype, values: &[f32]) -> Result<(), DeviceError> {
        self.write(at, &encode(dtype, values))
    }
}

impl DeviceCompute for BytesDevice {
    fn launch(&mut self, l: &Launch) -> Result<(), DeviceError> {
        match self.kernels {
            Some(Kernels::Refuse) => return Err(DeviceError::Driver("no kernel image".into())),
            Some(Kernels::Idle) | None => return Ok(()),
            Some(Kernels::Emulate) => {}
        }
        if let Some(done) = self.emulate_attention(l) {
            return done;
        }
        if let Some(done) = self.emulate_transformer(l) {
            return done;
        }
        let a = &l.args;
        let ptr = |i: usize| match a[i] {
            K::Ptr(p) => p,
            _ => panic!("{}: argument {i} is not a pointer", l.kernel),
        };
        let ty = |i: usize| match a[i] {
            K::I32(c) => dtype_of(c),
            _ => panic!("{}: argument {i} is not a type", l.kernel),
        };
        let int = |i: usize| match a[i] {
            K::I64(v) => v as usize,
            K::I32(v) => v as usize,
            _ => panic!("{}: argument {i} is not an integer", l.kernel),
        };
        let float = |i: usize| match a[i] {
            K::F32(v) => v,
            _ => panic!("{}: argument {i} is not a float", l.kernel),
        };
        let rows = match l.grid {
            Grid::Rows(r) => r as usize,
            Grid::Elements(_) => 0,
        };
        let (out, to) = (ptr(0), ty(1));
        let value = match l.kernel {
            "fill" => vec![float(3); int(2)],
            "copy" => self.get(ptr(2), ty(3), int(4))?,
            "scale" => (self.get(ptr(2), ty(3), int(4))?.iter())
                .map(|v| v * float(5))
                .collect(),
            "sqrt_" => (self.get(ptr(2), ty(3), int(4))?.iter())
                .map(|v| v.sqrt())
                .collect(),
            "relu" => (self.get(ptr(2), ty(3), int(4))?.iter())
                .map(|v| v.max(0.0))
                .collect(),
            "relu_backward" => {
                let g = self.get(ptr(2), ty(3), int(6))?;
                let y = self.get(ptr(4), ty(5), int(6))?;
                g.iter()
                    .zip(&y)
                    .map(|(g, y)| if *y > 0.0 { *g } else { 0.0 })
                    .collect()
            }
            "add" => {
                let (n, nb) = (int(6), int(7));
                let a = self.get(ptr(2), ty(3), n)?;
                let b = self.get(ptr(4), ty(5), nb)?;
                (0..n).map(|i| a[i] + b[i % nb]).collect()
            }
            "bias_rows" => {
                let bias = self.get(ptr(2), ty(3), int(5))?;
                (0..int(4)).map(|i| bias[i % int(5)]).collect()
            }
            "sum_rows" => {
                let (n, r) = (int(4), int(5));
                let x = self.get(ptr(2), ty(3), n * r)?;
                (0..n).map(|j| (0..r).map(|k| x[k * n + j]).sum()).collect()
            }
            "softmax" | "softmax_backward" | "softmax_warps" | "softmax_backward_warps" => {
                let back = l.kernel.starts_with("softmax_backward");
                let first = if back { 6 } else { 4 };
                let cols = int(first);
                // A warp a row: the rows are an argument, the grid in blocks.
                let (rows, log) = match l.kernel.ends_with("_warps") {
                    true => (int(first + 1), int(first + 2)),
                    false => (rows, int(first + 1)),
                };
                let x = self.get(ptr(2), ty(3), rows * cols)?;
                let mut out = Vec::with_capacity(rows * cols);
                if back {
                    let y = self.get(ptr(4), ty(5), rows * cols)?;
                    for (g, y) in x.chunks(cols).zip(y.chunks(cols)) {
                        if log == 1 {
                            let s: f32 = g.iter().sum();
                            out.extend(g.iter().zip(y).map(|(g, y)| g - libm::expf(*y) * s));
                        } else {
                            let dot: f32 = g.iter().zip(y).map(|(g, y)| g * y).sum();
                            out.extend(g.iter().zip(y).map(|(g, y)| y * (g - dot)));
                        }
                    }
                } else {
                    for row in x.chunks(cols) {
                        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let s: f32 = row.iter().map(|v| libm::expf(v - m)).sum();
                        match log == 1 {
                            true => out.extend(row.iter().map(|v| v - (libm::logf(s) + m))),
                            false => out.extend(row.iter().map(|v| libm::expf(v - m) / s)),
                        }
                    }
                }
                out
            }
            "nll" => {
                let (r, classes) = (int(8), int(9));
                let lp = self.get(ptr(4), ty(5), r * classes)?;
                let t = self.get(ptr(6), ty(7), r)?;
                let total: f32 = t
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| -lp[i * classes + t as usize])
                    .sum();
                self.put(ptr(2), ty(3), &[r as f32])?;
                vec![total / r as f32]
            }
            "nll_backward" => {
                let (n, classes) = (int(8), int(9));
                let g = self.get(ptr(2), ty(3), 1)?[0];
                let t = self.get(ptr(4), ty(5), n / classes)?;
                let w = self.get(ptr(6), ty(7), 1)?[0];
                let at = |i: usize| t[i / classes] as usize == i % classes;
                (0..n).map(|i| if at(i) { -g / w } else { 0.0 }).collect()
            }
            "init_param" => {
                let (n, rule, bound) = (int(2), int(3), float(4));
                let (seed, index) = (int(5) as u64, int(6) as u64);
                let g = |j: usize| crate::train::data::gaussian(seed, index, j as u64);
                (0..n)
                    .map(|j| match rule {
                        0 => (2.0 * ((libm::tanhf(g(j)) + 1.0) / 2.0) - 1.0) * bound,
                        1 => g(j),
                        2 => 1.0,
                        _ => 0.0,
                    })
                    .collect()
            }
            "synthetic_batch" => {
                let set = crate::train::data::Synthetic {
                    samples: int(6) as u64,
                    features: int(7) as u64,
                    classes: int(8) as u64,
                    seed: int(9) as u64,
                };
                let (x, y) = set.batch(int(4) as u64, int(5) as u64);
                let labels: Vec<f32> = y.iter().map(|&c| c as f32).collect();
                self.put(ptr(2), ty(3), &labels)?;
                x
            }
            "adam_update" => {
                let n = int(8);
                let [lr, b1, b2, eps, bc1, bc2, decay] = [9, 10, 11, 12, 13, 14, 15].map(float);
                let g = self.get(ptr(2), ty(3), n)?;
                let mut m = self.get(ptr(4), ty(5), n)?;
                let mut v = self.get(ptr(6), ty(7), n)?;
                let mut p = self.get(out, to, n)?;
                for j in 0..n {
                    p[j] *= 1.0 - lr * decay;
                    m[j] += (g[j] - m[j]) * (1.0 - b1);
                    v[j] = v[j] * b2 + (1.0 - b2) * g[j] * g[j];
                    p[j] -= (lr / bc1) * m[j] / (v[j].sqrt() / bc2 + eps);
                }
                self.put(ptr(4), ty(5), &m)?;
                self.put(ptr(6), ty(7), &v)?;
                p
            }
            other => match self.emulate_cnn(l) {
                Some(value) => value?,
                None => return Err(DeviceError::Driver(format!("{other} is not emulated"))),
            },
        };
        self.put(out, to, &value)
    }

    fn gemm(&mut self, g: &GemmEx) -> Result<(), DeviceError> {
        if self.kernels != Some(Kernels::Emulate) {
            return self.launch(&Launch {
                kernel: "gemm",
                grid: Grid::Rows(1),
                args: vec![],
            });
        }
        let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
        let span = |ld: u64, cols: usize| ld as usize * (cols - 1) + ld as usize;
        let a_cols = if g.transa { m } else { k };
        let b_cols = if g.transb { k } else { n };
        for z in 0..g.batch {
            let a = self.get(
                g.a.at + z * g.a.stride * g.a.dtype.size_bytes(),
                g.a.dtype,
                span(g.a.ld, a_cols),
            )?;
            let b = self.get(
                g.b.at + z * g.b.stride * g.b.dtype.size_bytes(),
                g.b.dtype,
                span(g.b.ld, b_cols),
            )?;
            let c_at = g.c.at + z * g.c.stride * g.c.dtype.size_bytes();
            let mut c = self.get(c_at, g.c.dtype, span(g.c.ld, n))?;
            let ld = |x: u64| x as usize;
            for i in 0..m {
                for j in 0..n {
                    let sum: f32 = (0..k)
                        .map(|p| {
                            let x = if g.transa {
                                a[i * ld(g.a.ld) + p]
                            } else {
                                a[p * ld(g.a.ld) + i]
                            };
                            let y = if g.transb {
                                b[p * ld(g.b.ld) + j]
                            } else {
                                b[j * ld(g.b.ld) + p]
                            };
                            x * y
                        })
                        .sum();
                    let at = j * ld(g.c.ld) + i;
                    // With beta 0, cuBLAS does not read C.
                    let before = if g.beta == 0.0 { 0.0 } else { g.beta * c[at] };
                    c[at] = g.alpha * sum + before;
                }
            }
            self.put(c_at, g.c.dtype, &c)?;
        }
        Ok(())
    }
}

fn mlp() -> serde_json::Value {
    json!({"kind":"mlp","layers":2,"width":32,"input_dim":16,"classes":4})
}

fn note(e: &mut super::Engine) -> String {
    let line = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2,"batch_size":8});
    let r = e.run_line(&line.to_string());
    assert!(r.ok, "{:?}", r.error);
    r.note.expect("a train note")
}

/// The MLP's forward and backward computed by the device: the losses are
/// the CPU's within float32's rounding of sums in another order, and the
/// note says which ops ran there.
#[test]
fn an_mlp_step_computed_by_the_devices_kernels_follows_the_cpu() {
    for extra in [
        json!({}),
        json!({"amp":"bfloat16"}),
        json!({"accumulate":2}),
    ] {
        let cpu = losses(&mut engine(mlp(), "adam", 16, 4), &extra);
        let (mut e, _) = on_device_with(&mlp(), (16, 4), None, Some(Kernels::Emulate));
        let device = losses(&mut e, &extra);
        let tolerance = if extra["amp"].is_string() { 1e-2 } else { 1e-5 };
        for (d, c) in device.iter().zip(&cpu) {
            let (d, c) = (d.expect("a loss"), c.expect("a loss"));
            assert!((d - c).abs() <= tolerance * c.abs(), "{extra}: {d} vs {c}");
        }
    }
    let (mut e, _) = on_device_with(&mlp(), (16, 4), None, Some(Kernels::Emulate));
    let said = note(&mut e);
    assert!(said.contains("computed on the GPU ("), "{said}");
    assert!(said.contains("ops by its kernels and cuBLAS"), "{said}");
}

/// A device whose launches fail, or that computes nothing, gives no loss
/// (never a wrong one), and the note says which op and why.
#[test]
fn a_device_whose_kernels_fail_or_compute_nothing_gives_no_loss() {
    for (kernels, why) in [
        (Kernels::Refuse, "no kernel image"),
        (Kernels::Idle, "where the CPU has"),
    ] {
        let (mut e, _) = on_device_with(&mlp(), (16, 4), None, Some(kernels));
        let got = losses(&mut e, &json!({}));
        assert!(got.iter().all(Option::is_none), "{kernels:?}: {got:?}");
        let said = note(&mut e);
        assert!(
            said.contains("the GPU's values were not the CPU's"),
            "{said}"
        );
        assert!(said.contains(why), "{kernels:?}: {said}");
    }
}

/// A step too big for the CPU (here: a limit of 0 FLOPs), on a device
/// whose kernels run every op: it runs there alone, from parameters drawn
/// there as the host draws them, batches drawn there, and Adam's updates
/// there; its losses are the CPU's, and the host holds no values.
#[test]
fn a_step_too_big_for_the_cpu_runs_on_the_device_alone() {
    let cpu = losses(&mut engine(mlp(), "adam", 16, 4), &json!({}));
    let (mut e, _) = on_device_with(&mlp(), (16, 4), None, Some(Kernels::Emulate));
    e.flop_limit = 0;
    let device = losses(&mut e, &json!({}));
    for (d, c) in device.iter().zip(&cpu) {
        let (d, c) = (d.expect("a loss"), c.expect("a loss"));
        assert!((d - c).abs() <= 1e-5 * c.abs(), "{device:?} vs {cpu:?}");
    }
    assert!(
        cpu.windows(2).any(|w| w[0] != w[1]),
        "the steps learn: {cpu:?}"
    );
    // `zero_grad(set_to_none=False)` zeroes the `.grad`s on the device,
    // where the next step's gradients are added into them.
    let kept = json!({"set_to_none": false, "accumulate": 2});
    let cpu_kept = losses(&mut engine(mlp(), "adam", 16, 4), &kept);
    let (mut k, _) = on_device_with(&mlp(), (16, 4), None, Some(Kernels::Emulate));
    k.flop_limit = 0;
    let device_kept = losses(&mut k, &kept);
    for (d, c) in device_kept.iter().zip(&cpu_kept) {
        let (d, c) = (d.expect("a loss"), c.expect("a loss"));
        assert!(
            (d - c).abs() <= 1e-5 * c.abs(),
            "{device_kept:?} vs {cpu_kept:?}"
        );
    }
    let state = e.train.models.values().next().unwrap();
    assert!(state.device_resident && state.values.is_none());
    let said = note(&mut e);
    assert!(said.contains("computed on the GPU alone ("), "{said}");
    // A device that runs no code: the step is shape-only, as before.
    let (mut e, _) = on_device_with(&mlp(), (16, 4), None, None);
    e.flop_limit = 0;
    assert!(losses(&mut e, &json!({})).iter().all(Option::is_none));
}

/// On the GPU alone, a `step` after a `forward` and `backward` that ran
/// shape-only (too big for the CPU, and statements run no kernels) leaves
/// the parameters as they were: their `.grad`s hold nothing computed.
#[test]
fn a_shape_only_backward_gives_the_devices_step_nothing_to_apply() {
    let (mut e, _) = on_device_with(&mlp(), (16, 4), None, Some(Kernels::Emulate));
    e.flop_limit = 0;
    let train = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":8});
    assert!(e.run_line(&train.to_string()).ok);
    let first = {
        let state = e.train.models.values().next().unwrap();
        state.params[0]
    };
    let read = |e: &mut super::Engine| {
        let at = e.process.address(first).unwrap();
        let mut bytes = vec![0u8; 64];
        e.process
            .device
            .memory()
            .unwrap()
            .read(at, &mut bytes)
            .unwrap();
        bytes
    };
    let before = read(&mut e);
    for line in [
        json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":8}),
        json!({"cmd":"backward","name":"loss"}),
        json!({"cmd":"step","optimizer":"opt"}),
    ] {
        let r = e.run_line(&line.to_string());
        assert!(r.ok, "{line}: {:?}", r.error);
    }
    assert_eq!(
        read(&mut e),
        before,
        "the step applied gradients nothing computed"
    );
    // The next step on the device computes its gradients and applies them.
    assert!(e.run_line(&train.to_string()).ok);
    assert_ne!(read(&mut e), before);
}

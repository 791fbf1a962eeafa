//! Fused attention on a device that runs code: its kernels
//! (`train::kernels::attention`) emulated in Rust as the CUDA source
//! computes them, a block a row (the key's and value's gradients gathered
//! over the queries after each key, where the CPU scatters them), planned
//! on tensors in the device's memory and held to the CPU interpreter's
//! values; the source itself runs on a GPU (`server/tests/gpu.rs`).

use super::on_device::{decode, encode};
use super::on_device_compute_tests::{Args, Kernels};
use super::on_device_tests::BytesDevice;
use crate::compute::Launch;
use crate::device::{Device, DeviceMemory};
use crate::error::DeviceError;
use crate::train::cpu::{self, View};
use crate::train::kernels::{plan, Place};
use crate::train::kinds::step::{Arg, Calc};
use crate::types::Dtype;

/// Heads, sequence, head size, the log-sum-exp's rows, the batch.
#[derive(Clone, Copy)]
struct Shape {
    h: usize,
    s: usize,
    d: usize,
    rows: usize,
    b: usize,
}

impl Shape {
    fn width(&self) -> usize {
        self.h * self.d
    }

    fn qkv(&self, bi: usize, i: usize, p: usize, hi: usize) -> usize {
        ((bi * self.s + i) * 3 + p) * self.width() + hi * self.d
    }

    fn tok(&self, bi: usize, i: usize, hi: usize) -> usize {
        (bi * self.s + i) * self.width() + hi * self.d
    }

    /// The elements of a gradient's buffer: one part's, or all three's
    /// packed.
    fn grads_len(&self, packed: bool) -> usize {
        let parts = if packed { 3 } else { 1 };
        parts * self.b * self.s * self.width()
    }

    fn grad(&self, packed: bool, p: usize, bi: usize, hi: usize, i: usize) -> usize {
        match packed {
            true => self.qkv(bi, i, p, hi),
            false => ((bi * self.h + hi) * self.s + i) * self.d,
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl BytesDevice {
    /// Fused attention's kernels, or `None` for another.
    pub(super) fn emulate_attention(&mut self, l: &Launch) -> Option<Result<(), DeviceError>> {
        if !l.kernel.starts_with("sdpa_") {
            return None;
        }
        let a = Args(l);
        let (int, at) = (|i| a.int(i), |i| a.tensor(i));
        let shape = |first: usize| {
            let [h, s, d, rows] = [first, first + 1, first + 2, first + 3].map(int);
            let b = a.rows() / (h * s).max(1);
            (Shape { h, s, d, rows, b }, a.float(first + 4))
        };
        Some(match l.kernel {
            "sdpa_forward" => {
                let (sh, scale) = shape(6);
                self.sdpa_forward([at(0), at(2), at(4)], sh, scale)
            }
            "sdpa_backward_q" => {
                let (sh, scale) = shape(10);
                let tensors = [at(0), at(2), at(4), at(6), at(8)];
                self.sdpa_backward_q(tensors, sh, scale, int(15) == 1)
            }
            "sdpa_backward_kv" => {
                let (sh, scale) = shape(12);
                let tensors = [at(0), at(2), at(4), at(6), at(8), at(10)];
                self.sdpa_backward_kv(tensors, sh, scale, int(17) == 1)
            }
            _ => return None,
        })
    }

    fn sdpa_forward(
        &mut self,
        [out, lse, qkv]: [(u64, crate::types::Dtype); 3],
        sh: Shape,
        scale: f32,
    ) -> Result<(), DeviceError> {
        let x = self.get(qkv.0, qkv.1, sh.b * sh.s * 3 * sh.width())?;
        let mut o = vec![0.0; sh.b * sh.s * sh.width()];
        let mut l = self.get(lse.0, lse.1, sh.b * sh.h * sh.rows)?;
        for r in 0..sh.b * sh.h * sh.s {
            let (i, hi, bi) = (r % sh.s, r / sh.s % sh.h, r / sh.s / sh.h);
            let q = &x[sh.qkv(bi, i, 0, hi)..][..sh.d];
            let scores: Vec<f32> = (0..=i)
                .map(|j| dot(q, &x[sh.qkv(bi, j, 1, hi)..][..sh.d]) * scale)
                .collect();
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = scores.iter().map(|v| libm::expf(v - m)).sum();
            let log_sum = libm::logf(sum) + m;
            l[r / sh.s * sh.rows + i] = log_sum;
            if i == sh.s - 1 {
                l[r / sh.s * sh.rows + sh.s..][..sh.rows - sh.s].fill(0.0);
            }
            for t in 0..sh.d {
                o[sh.tok(bi, i, hi) + t] = (0..=i)
                    .map(|j| libm::expf(scores[j] - log_sum) * x[sh.qkv(bi, j, 2, hi) + t])
                    .sum();
            }
        }
        self.put(lse.0, lse.1, &l)?;
        self.put(out.0, out.1, &o)
    }

    /// The operands every backward reads: the output's gradient, the
    /// projection, the output, the log-sum-exp.
    fn attention_operands(
        &mut self,
        [g, qkv, out, lse]: [(u64, crate::types::Dtype); 4],
        sh: Shape,
    ) -> Result<[Vec<f32>; 4], DeviceError> {
        let tokens = sh.b * sh.s * sh.width();
        Ok([
            self.get(g.0, g.1, tokens)?,
            self.get(qkv.0, qkv.1, 3 * tokens)?,
            self.get(out.0, out.1, tokens)?,
            self.get(lse.0, lse.1, sh.b * sh.h * sh.rows)?,
        ])
    }

    fn sdpa_backward_q(
        &mut self,
        [dq, g, qkv, out, lse]: [(u64, crate::types::Dtype); 5],
        sh: Shape,
        scale: f32,
        packed: bool,
    ) -> Result<(), DeviceError> {
        let [g, x, o, l] = self.attention_operands([g, qkv, out, lse], sh)?;
        let n = sh.grads_len(packed);
        let mut grad = self.get(dq.0, dq.1, n)?;
        for r in 0..sh.b * sh.h * sh.s {
            let (i, hi, bi) = (r % sh.s, r / sh.s % sh.h, r / sh.s / sh.h);
            let (gi, q) = (
                &g[sh.tok(bi, i, hi)..][..sh.d],
                &x[sh.qkv(bi, i, 0, hi)..][..sh.d],
            );
            let delta = dot(gi, &o[sh.tok(bi, i, hi)..][..sh.d]);
            let log_sum = l[r / sh.s * sh.rows + i];
            let ds: Vec<f32> = (0..=i)
                .map(|j| {
                    let k = &x[sh.qkv(bi, j, 1, hi)..][..sh.d];
                    let p = libm::expf(dot(q, k) * scale - log_sum);
                    p * (dot(gi, &x[sh.qkv(bi, j, 2, hi)..][..sh.d]) - delta) * scale
                })
                .collect();
            for t in 0..sh.d {
                grad[sh.grad(packed, 0, bi, hi, i) + t] =
                    (0..=i).map(|j| ds[j] * x[sh.qkv(bi, j, 1, hi) + t]).sum();
            }
        }
        self.put(dq.0, dq.1, &grad)
    }

    fn sdpa_backward_kv(
        &mut self,
        [dk, dv, g, qkv, out, lse]: [(u64, crate::types::Dtype); 6],
        sh: Shape,
        scale: f32,
        packed: bool,
    ) -> Result<(), DeviceError> {
        let [g, x, o, l] = self.attention_operands([g, qkv, out, lse], sh)?;
        let n = sh.grads_len(packed);
        let mut gk = self.get(dk.0, dk.1, n)?;
        let mut gv = match packed {
            true => Vec::new(),
            false => self.get(dv.0, dv.1, n)?,
        };
        for r in 0..sh.b * sh.h * sh.s {
            let (j, hi, bi) = (r % sh.s, r / sh.s % sh.h, r / sh.s / sh.h);
            let (k, v) = (
                &x[sh.qkv(bi, j, 1, hi)..][..sh.d],
                &x[sh.qkv(bi, j, 2, hi)..][..sh.d],
            );
            let (mut ps, mut dss) = (Vec::new(), Vec::new());
            for i in j..sh.s {
                let gi = &g[sh.tok(bi, i, hi)..][..sh.d];
                let delta = dot(gi, &o[sh.tok(bi, i, hi)..][..sh.d]);
                let q = &x[sh.qkv(bi, i, 0, hi)..][..sh.d];
                let p = libm::expf(dot(q, k) * scale - l[r / sh.s * sh.rows + i]);
                ps.push(p);
                dss.push(p * (dot(gi, v) - delta) * scale);
            }
            for t in 0..sh.d {
                let (mut dkv, mut dvv) = (0.0, 0.0);
                for i in j..sh.s {
                    dvv += ps[i - j] * g[sh.tok(bi, i, hi) + t];
                    dkv += dss[i - j] * x[sh.qkv(bi, i, 0, hi) + t];
                }
                gk[sh.grad(packed, 1, bi, hi, j) + t] = dkv;
                let dv_grad = if packed { &mut gk } else { &mut gv };
                dv_grad[sh.grad(packed, 2, bi, hi, j) + t] = dvv;
            }
        }
        self.put(dk.0, dk.1, &gk)?;
        match packed {
            true => Ok(()),
            false => self.put(dv.0, dv.1, &gv),
        }
    }
}

/// Values in the device's memory at a new block; its place.
fn tensor<'a>(device: &mut BytesDevice, shape: &'a [u64], values: &[f32]) -> Place<'a> {
    let at = device.malloc(4 * values.len().max(1) as u64).unwrap();
    device.write(at, &encode(Dtype::Float32, values)).unwrap();
    Place {
        at,
        shape,
        dtype: Dtype::Float32,
    }
}

fn read(device: &mut BytesDevice, p: &Place) -> Vec<f32> {
    let mut bytes = vec![0; 4 * p.numel() as usize];
    device.read(p.at, &mut bytes).unwrap();
    decode(Dtype::Float32, &bytes)
}

/// Runs what `plan` makes of `calc` on the device.
fn run(device: &mut BytesDevice, calc: Calc, (out, parts): (Place, &[Place]), args: &[Place]) {
    let calls = plan(&calc, out, parts, args, None).expect("a kernel plans it");
    for call in calls {
        call.run(device).unwrap();
    }
}

fn assert_close(what: &str, have: &[f32], want: &[f32]) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_eq!(have.len(), want.len(), "{what}");
    for (i, (h, w)) in have.iter().zip(want).enumerate() {
        assert!((h - w).abs() <= 1e-5 * scale, "{what}[{i}]: {h} vs {w}");
    }
}

/// Fused attention and both its backwards (gradients as heads, the flash
/// kernel's; packed in the projection's layout, the memory-efficient
/// kernel's) planned and run on the device: each output the CPU's, the
/// log-sum-exp's padded rows zeros as the CPU has them.
#[test]
fn fused_attention_on_the_devices_kernels_is_the_cpus() {
    let (b, s, h, d, rows) = (2u64, 5u64, 2u64, 3u64, 32u64);
    let width = h * d;
    let wave = |n: u64, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
    let mut device = BytesDevice::with(1 << 30, Kernels::Emulate);
    let (token_shape, qkv_shape, lse_shape) = ([b, s, width], [b, s, 3 * width], [b, h, rows]);
    let heads_shape = [b, h, s, d];
    let qkv_values = wave(b * s * 3 * width, 0.37);
    let qkv = tensor(&mut device, &qkv_shape, &qkv_values);
    let out = tensor(
        &mut device,
        &token_shape,
        &vec![0.0; (b * s * width) as usize],
    );
    let lse = tensor(&mut device, &lse_shape, &vec![7.0; (b * h * rows) as usize]);
    let t = Arg::T(0);
    let sdpa = Calc::Sdpa {
        qkv: t,
        heads: h,
        lse_align: rows,
    };
    run(&mut device, sdpa, (out, &[lse]), &[qkv]);
    let view = |data: &'static [f32], shape: &'static [u64]| View { data, shape };
    let leak = |v: Vec<f32>| -> &'static [f32] { Box::leak(v.into_boxed_slice()) };
    let leak_shape = |v: Vec<u64>| -> &'static [u64] { Box::leak(v.into_boxed_slice()) };
    let qkv_view = view(leak(qkv_values), leak_shape(qkv_shape.to_vec()));
    let want = cpu::sdpa(&qkv_view, h as usize, &token_shape, rows as usize).unwrap();
    let (have_out, have_lse) = (read(&mut device, &out), read(&mut device, &lse));
    assert_close("output", &have_out, &want[0]);
    for (i, (hv, wv)) in have_lse.iter().zip(&want[1]).enumerate() {
        match i as u64 % rows < s {
            true => assert!((hv - wv).abs() <= 1e-5 * wv.abs().max(1.0), "lse[{i}]"),
            false => assert_eq!((*hv, *wv), (0.0, 0.0), "padded row {i}"),
        }
    }
    let g_values = wave(b * s * width, 0.91);
    let g = tensor(&mut device, &token_shape, &g_values);
    let args = [g, qkv, out, lse];
    let (g_view, out_view, lse_view) = (
        view(leak(g_values), leak_shape(token_shape.to_vec())),
        view(leak(have_out), leak_shape(token_shape.to_vec())),
        view(leak(have_lse), leak_shape(lse_shape.to_vec())),
    );
    let views = (&g_view, &qkv_view, &out_view, &lse_view);
    let heads_n = (b * h * s * d) as usize;
    let grads: Vec<Place> = (0..3)
        .map(|_| tensor(&mut device, &heads_shape, &vec![0.0; heads_n]))
        .collect();
    let backward = Calc::SdpaBackward {
        grad: t,
        qkv: t,
        out: t,
        lse: t,
    };
    run(&mut device, backward, (grads[0], &grads[1..]), &args);
    let want = cpu::sdpa_backward(views.0, views.1, views.2, views.3).unwrap();
    for (k, name) in ["q", "k", "v"].iter().enumerate() {
        assert_close(name, &read(&mut device, &grads[k]), &want[k]);
    }
    let packed = tensor(
        &mut device,
        &qkv_shape,
        &vec![0.0; 3 * (b * s * width) as usize],
    );
    let backward = Calc::SdpaBackwardPacked {
        grad: t,
        qkv: t,
        out: t,
        lse: t,
    };
    run(&mut device, backward, (packed, &[]), &args);
    let want = cpu::sdpa_backward_packed(views.0, views.1, views.2, views.3).unwrap();
    assert_close("packed", &read(&mut device, &packed), &want[0]);
}

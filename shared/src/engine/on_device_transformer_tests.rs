//! A transformer's step on a device that runs code: the kernels it needs
//! beyond the MLP's (embeddings, norms, GELU, the causal mask, heads and
//! their gradients' joining) emulated in Rust as the CUDA source computes
//! them, so a whole step, its attention written out or fused, runs on the
//! emulated device, held to the CPU op by op; the source itself ran on an
//! H100 (`tests/golden/gpu-kernels.txt`).

use super::on_device_compute_tests::{Args, Kernels};
use super::on_device_tests::{losses, on_device_with, BytesDevice};
use crate::compute::Launch;
use crate::error::DeviceError;
use crate::types::Dtype;
use serde_json::json;

type Done = Result<(), DeviceError>;

/// The kernels that write their first tensor element by element.
const ELEMENTWISE: [&str; 10] = [
    "arange",
    "not_",
    "tril",
    "gelu_",
    "gelu_backward",
    "masked_fill",
    "embedding",
    "heads",
    "merge_heads",
    "cat_part",
];

impl BytesDevice {
    /// The transformer's kernels beyond the MLP's, or `None` for another.
    pub(super) fn emulate_transformer(&mut self, l: &Launch) -> Option<Done> {
        let a = Args(l);
        let (int, at, rows) = (|i| a.int(i), |i| a.tensor(i), a.rows());
        Some(match l.kernel {
            "embedding_backward" => {
                self.embedding_backward(a.ptr(0), (at(1), at(3)), [5, 6, 7].map(int))
            }
            "norm_rows" => {
                let tensors = [0, 2, 4, 6, 8, 10].map(at);
                self.norm_rows(&tensors, rows, (int(12), int(13)), a.float(14))
            }
            "norm_backward_input" => {
                self.norm_backward_input(&[0, 2, 4, 6, 8, 10].map(at), rows, (int(12), int(13)))
            }
            "norm_backward_params" => {
                self.norm_backward_params(&[0, 2, 4, 6, 8, 10].map(at), [12, 13, 14].map(int))
            }
            "synthetic_sequences" => {
                let [start, batch, samples, len, vocab, seed] = [4, 5, 6, 7, 8, 9].map(int);
                let set = crate::train::data::Synthetic {
                    samples: samples as u64,
                    features: len as u64,
                    classes: vocab as u64,
                    seed: seed as u64,
                };
                let (x, y) = set.sequences(start as u64, batch as u64);
                let (tx, ty) = (at(0), at(2));
                self.put(tx.0, tx.1, &x)
                    .and_then(|()| self.put(ty.0, ty.1, &y))
            }
            kernel if ELEMENTWISE.contains(&kernel) => {
                let out = at(0);
                self.elementwise(&a)
                    .and_then(|v| self.put(out.0, out.1, &v))
            }
            _ => return None,
        })
    }

    /// [`ELEMENTWISE`]'s kernels: the value of their first tensor.
    fn elementwise(&mut self, a: &Args) -> Result<Vec<f32>, DeviceError> {
        let (int, at) = (|i| a.int(i), |i| a.tensor(i));
        let mut get = |(p, t): (u64, Dtype), n: usize| self.get(p, t, n);
        Ok(match a.0.kernel {
            "arange" => (0..int(2)).map(|i| i as f32).collect(),
            "not_" => get(at(2), int(4))?.iter().map(|v| 1.0 - v).collect(),
            "tril" => {
                let (n, cols) = (int(2), int(3));
                let one = |i: usize| i % cols <= (i / cols) % cols;
                (0..n).map(|i| f32::from(u8::from(one(i)))).collect()
            }
            "gelu_" => get(at(2), int(4))?.iter().map(|&v| gelu(v)).collect(),
            "gelu_backward" => {
                let n = int(6);
                let (g, x) = (get(at(2), n)?, get(at(4), n)?);
                g.iter().zip(&x).map(|(g, &v)| g * gelu_slope(v)).collect()
            }
            "masked_fill" => {
                let (n, nm) = (int(6), int(7));
                let value = a.float(8);
                let (x, m) = (get(at(2), n)?, get(at(4), nm)?);
                (0..n)
                    .map(|i| if m[i % nm] != 0.0 { value } else { x[i] })
                    .collect()
            }
            "embedding" => {
                let [n, cols, rows] = [6, 7, 8].map(&int);
                let (w, ids) = (get(at(2), rows * cols)?, get(at(4), n / cols)?);
                (0..n)
                    .map(|i| {
                        let id = ids[i / cols] as i64;
                        match (0..rows as i64).contains(&id) {
                            true => w[id as usize * cols + i % cols],
                            false => f32::NAN,
                        }
                    })
                    .collect()
            }
            "heads" => {
                let [n, s, h, d, row, part] = [4, 5, 6, 7, 8, 9].map(&int);
                let x = get(at(2), n / (h * d) * row)?;
                (0..n)
                    .map(|i| {
                        let (t, dd) = (i / d, i % d);
                        let (bh, ss) = (t / s, t % s);
                        let (b, hh) = (bh / h, bh % h);
                        x[(b * s + ss) * row + part * h * d + hh * d + dd]
                    })
                    .collect()
            }
            "merge_heads" => {
                let [n, s, h, d] = [4, 5, 6, 7].map(&int);
                let x = get(at(2), n)?;
                (0..n)
                    .map(|i| {
                        let (t, dd) = (i / d, i % d);
                        let (bs, hh) = (t / h, t % h);
                        let (b, ss) = (bs / s, bs % s);
                        x[((b * h + hh) * s + ss) * d + dd]
                    })
                    .collect()
            }
            "cat_part" => {
                let [n, s, h, d, row, p] = [4, 5, 6, 7, 8, 9].map(&int);
                let width = row / 3;
                let part = get(at(2), n)?;
                let out_at = at(0);
                let mut out = get(out_at, n / width * row)?;
                for i in 0..n {
                    let (t, c) = (i / width, i % width);
                    let src = match h > 0 {
                        true => {
                            let (b, hh) = (t / s, c / d);
                            ((b * h + hh) * s + (t - b * s)) * d + (c - hh * d)
                        }
                        false => i,
                    };
                    out[t * row + p * width + c] = part[src];
                }
                out
            }
            other => unreachable!("{other} is not in ELEMENTWISE"),
        })
    }

    fn embedding_backward(
        &mut self,
        out: u64,
        (grad, ids): ((u64, Dtype), (u64, Dtype)),
        [n, cols, rows]: [usize; 3],
    ) -> Done {
        let (g, ids) = (
            self.get(grad.0, grad.1, n)?,
            self.get(ids.0, ids.1, n / cols)?,
        );
        let mut table = self.get(out, Dtype::Float32, rows * cols)?;
        for i in 0..n {
            let id = ids[i / cols] as i64;
            if (0..rows as i64).contains(&id) {
                table[id as usize * cols + i % cols] += g[i];
            }
        }
        self.put(out, Dtype::Float32, &table)
    }

    /// LayerNorm (`layer`) or RMSNorm a row at a time: the output, the
    /// mean (LayerNorm) and the inverse deviation.
    fn norm_rows(
        &mut self,
        t: &[(u64, Dtype); 6],
        rows: usize,
        (cols, layer): (usize, usize),
        eps: f32,
    ) -> Done {
        let [out, mean, rstd, x, weight, bias] = *t;
        let xv = self.get(x.0, x.1, rows * cols)?;
        let (w, b) = (
            self.get(weight.0, weight.1, cols)?,
            self.get(bias.0, bias.1, cols)?,
        );
        let (mut o, mut means, mut rstds) = (Vec::new(), Vec::new(), Vec::new());
        for row in xv.chunks(cols) {
            let mu = match layer {
                1 => row.iter().sum::<f32>() / cols as f32,
                _ => 0.0,
            };
            let q: f32 = row.iter().map(|v| (v - mu) * (v - mu)).sum();
            let inv = 1.0 / (q / cols as f32 + eps).sqrt();
            for (j, v) in row.iter().enumerate() {
                let y = (v - mu) * inv * w[j];
                o.push(if layer == 1 { y + b[j] } else { y });
            }
            means.push(mu);
            rstds.push(inv);
        }
        if layer == 1 {
            self.put(mean.0, mean.1, &means)?;
        }
        self.put(rstd.0, rstd.1, &rstds)?;
        self.put(out.0, out.1, &o)
    }

    /// What a norm's backward reads: the gradient and the input (`rows` x
    /// `cols`), the mean and the inverse deviation (one a row).
    fn norm_saved(
        &mut self,
        [g, x, mean, rstd]: [(u64, Dtype); 4],
        rows: usize,
        cols: usize,
    ) -> Result<[Vec<f32>; 4], DeviceError> {
        Ok([
            self.get(g.0, g.1, rows * cols)?,
            self.get(x.0, x.1, rows * cols)?,
            self.get(mean.0, mean.1, rows)?,
            self.get(rstd.0, rstd.1, rows)?,
        ])
    }

    fn norm_backward_input(
        &mut self,
        t: &[(u64, Dtype); 6],
        rows: usize,
        (cols, layer): (usize, usize),
    ) -> Done {
        let [out, g, x, mean, rstd, weight] = *t;
        let [gv, xv, mv, rv] = self.norm_saved([g, x, mean, rstd], rows, cols)?;
        let w = self.get(weight.0, weight.1, cols)?;
        let mut o = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            let mu = if layer == 1 { mv[r] } else { 0.0 };
            let inv = rv[r];
            let row = |j: usize| (gv[r * cols + j] * w[j], (xv[r * cols + j] - mu) * inv);
            let sd: f32 = (0..cols).map(|j| row(j).0).sum();
            let sdx: f32 = (0..cols).map(|j| row(j).0 * row(j).1).sum();
            let sd = if layer == 1 { sd / cols as f32 } else { 0.0 };
            let sdx = sdx / cols as f32;
            o.extend((0..cols).map(|j| inv * (row(j).0 - sd - row(j).1 * sdx)));
        }
        self.put(out.0, out.1, &o)
    }

    fn norm_backward_params(
        &mut self,
        t: &[(u64, Dtype); 6],
        [cols, rows, layer]: [usize; 3],
    ) -> Done {
        let [dw, db, g, x, mean, rstd] = *t;
        let [gv, xv, mv, rv] = self.norm_saved([g, x, mean, rstd], rows, cols)?;
        let (mut w, mut b) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            let mu = if layer == 1 { mv[r] } else { 0.0 };
            for j in 0..cols {
                let gg = gv[r * cols + j];
                w[j] += gg * (xv[r * cols + j] - mu) * rv[r];
                b[j] += gg;
            }
        }
        if layer == 1 {
            self.put(db.0, db.1, &b)?;
        }
        self.put(dw.0, dw.1, &w)
    }
}

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU's derivative: its cumulative distribution plus x times its
/// density.
fn gelu_slope(x: f32) -> f32 {
    let cdf = 0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
    let pdf = libm::expf(-0.5 * x * x) * 0.398_942_3;
    cdf + x * pdf
}

/// A transformer's step computed by the device's kernels follows the
/// CPU, its attention written out or fused (on the default card the
/// memory-efficient kernel's packed gradients; on an A100 under bfloat16
/// autocast the flash kernel's), and a step too big for the CPU runs on
/// the device alone.
#[test]
fn a_transformer_step_computed_by_the_devices_kernels_follows_the_cpu() {
    let (gpt, features, classes) = super::kinds_tests::gpt(1, 16, 2, 8, 32);
    for (gpu, extra, tolerance, kernel) in [
        (None, json!({}), 1e-5, "computed on the GPU alone"),
        (
            None,
            json!({"attention":"sdpa"}),
            1e-5,
            "the memory-efficient kernel",
        ),
        (
            Some("a100-80gb"),
            json!({"attention":"sdpa","amp":"bfloat16"}),
            1e-2,
            "the flash kernel",
        ),
    ] {
        let restart = |e: &mut super::Engine| {
            let Some(gpu) = gpu else { return };
            let mut model = json!({"cmd":"model","name":"model"});
            for (k, v) in gpt.as_object().unwrap() {
                model[k] = v.clone();
            }
            for line in [
                json!({"cmd":"restart","framework":"pytorch","gpu":gpu}),
                model,
                json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
                json!({"cmd":"data","name":"data","samples":4096,"features":features,"classes":classes}),
            ] {
                let r = e.run_line(&line.to_string());
                assert!(r.ok, "{line}: {:?}", r.error);
            }
        };
        let mut cpu = super::kinds_tests::engine(gpt.clone(), "adam", features, classes);
        restart(&mut cpu);
        let cpu = losses(&mut cpu, &extra);
        let (mut e, _) = on_device_with(&gpt, (features, classes), None, Some(Kernels::Emulate));
        restart(&mut e);
        let device = losses(&mut e, &extra);
        for (d, c) in device.iter().zip(&cpu) {
            let (d, c) = (d.expect("a loss"), c.expect("a loss"));
            assert!((d - c).abs() <= tolerance * c.abs(), "{extra}: {d} vs {c}");
        }
        e.flop_limit = 0;
        let mut line = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":8});
        for (k, v) in extra.as_object().unwrap() {
            line[k] = v.clone();
        }
        let r = e.run_line(&line.to_string());
        assert!(r.ok, "{:?}", r.error);
        let note = r.note.expect("a train note");
        assert!(
            note.contains("computed on the GPU alone ("),
            "{extra}: {note}"
        );
        assert!(note.contains(kernel), "{extra}: {note}");
    }
}

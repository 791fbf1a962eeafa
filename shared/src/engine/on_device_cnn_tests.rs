//! A CNN step on a device that runs code: the CNN's kernels
//! (`train::kernels::cnn`) emulated in Rust as the CUDA source computes
//! them, each output element gathered as its thread gathers it (the CPU
//! interpreter scatters instead), so the kernels' index arithmetic and
//! the plans' arguments are held to the CPU's values here; the source
//! itself runs on a GPU (`server/tests/gpu.rs`).

use super::on_device_compute_tests::{Args, Kernels};
use super::on_device_tests::{losses, on_device_with, BytesDevice};
use crate::compute::Launch;
use crate::error::DeviceError;
use crate::types::Dtype;
use serde_json::json;

/// What a kernel computes into its first tensor.
type Value = Result<Vec<f32>, DeviceError>;

impl BytesDevice {
    /// The CNN's kernels, or `None` for another.
    pub(super) fn emulate_cnn(&mut self, l: &Launch) -> Option<Value> {
        let a = Args(l);
        let (int, at) = (|i| a.int(i), |i| a.tensor(i));
        Some(match l.kernel {
            "conv3x3" => {
                let [n, ci, co, h, w] = [8, 9, 10, 11, 12].map(int);
                self.conv3x3((at(2), at(4), at(6)), [n, ci, co, h, w])
            }
            "conv3x3_backward_input" => {
                let [n, ci, co, h, w] = [6, 7, 8, 9, 10].map(int);
                self.conv3x3_backward_input((at(2), at(4)), [n, ci, co, h, w])
            }
            "conv3x3_backward_params" => {
                let [n, ci, co, h, w] = [8, 9, 10, 11, 12].map(int);
                self.conv3x3_backward_params((at(2), at(4), at(6)), [n, ci, co, h, w])
            }
            "batch_norm" => {
                let tensors = [2, 4, 6, 8, 10].map(at);
                self.batch_norm(tensors, [12, 13, 14].map(int), a.float(15))
            }
            "batch_norm_backward" => {
                let tensors = [2, 4, 6, 8, 10, 12, 14].map(at);
                self.batch_norm_backward(tensors, [16, 17, 18].map(int))
            }
            "max_pool2" => self.max_pool2((at(2), at(4)), [6, 7, 8].map(int)),
            "max_pool2_backward" => self.max_pool2_backward((at(2), at(4)), [6, 7, 8].map(int)),
            _ => return None,
        })
    }

    fn all(&mut self, (p, t): (u64, Dtype), n: usize) -> Value {
        self.get(p, t, n)
    }

    fn conv3x3(
        &mut self,
        (x, weight, bias): ((u64, Dtype), (u64, Dtype), (u64, Dtype)),
        [n, ci, co, h, w]: [usize; 5],
    ) -> Value {
        let plane = h * w;
        let (x, k, b) = (
            self.all(x, n * ci * plane)?,
            self.all(weight, co * ci * 9)?,
            self.all(bias, co)?,
        );
        let out = (0..n * co * plane).map(|i| {
            let (p, bo) = (i % plane, i / plane);
            let (o, bb) = (bo % co, bo / co);
            let (y, xx) = ((p / w) as i64, (p % w) as i64);
            let mut acc = b[o];
            for c in 0..ci {
                let (src, kk) = ((bb * ci + c) * plane, (o * ci + c) * 9);
                let mut s = 0.0;
                for t in 0..9 {
                    let (yy, x2) = (y + t / 3 - 1, xx + t % 3 - 1);
                    if inside(yy, x2, h, w) {
                        s += k[kk + t as usize] * x[src + yy as usize * w + x2 as usize];
                    }
                }
                acc += s;
            }
            acc
        });
        Ok(out.collect())
    }

    fn conv3x3_backward_input(
        &mut self,
        (g, weight): ((u64, Dtype), (u64, Dtype)),
        [n, ci, co, h, w]: [usize; 5],
    ) -> Value {
        let plane = h * w;
        let (g, k) = (self.all(g, n * co * plane)?, self.all(weight, co * ci * 9)?);
        let out = (0..n * ci * plane).map(|i| {
            let (q, bc) = (i % plane, i / plane);
            let (c, b) = (bc % ci, bc / ci);
            let (y, xx) = ((q / w) as i64, (q % w) as i64);
            let mut acc = 0.0;
            for o in 0..co {
                let (go, kk) = ((b * co + o) * plane, (o * ci + c) * 9);
                for t in (0..9).rev() {
                    let (py, px) = (y + 1 - t / 3, xx + 1 - t % 3);
                    if inside(py, px, h, w) {
                        acc += g[go + py as usize * w + px as usize] * k[kk + t as usize];
                    }
                }
            }
            acc
        });
        Ok(out.collect())
    }

    /// The weight's gradient as the value; the bias's written here.
    fn conv3x3_backward_params(
        &mut self,
        (db, g, x): ((u64, Dtype), (u64, Dtype), (u64, Dtype)),
        [n, ci, co, h, w]: [usize; 5],
    ) -> Value {
        let plane = h * w;
        let (gv, xv) = (self.all(g, n * co * plane)?, self.all(x, n * ci * plane)?);
        let mut dw = vec![0.0; co * ci * 9];
        let mut bias = vec![0.0; co];
        for (k, slot) in dw.iter_mut().enumerate() {
            let (t, c, o) = ((k % 9) as i64, (k / 9) % ci, k / (ci * 9));
            let (dy, dx) = (t / 3 - 1, t % 3 - 1);
            let (mut s, mut sb) = (0.0, 0.0);
            for e in 0..n * plane {
                let (b, p) = (e / plane, e % plane);
                let (y, xx) = ((p / w) as i64, (p % w) as i64);
                let gg = gv[(b * co + o) * plane + p];
                sb += gg;
                if inside(y + dy, xx + dx, h, w) {
                    let q = (y + dy) as usize * w + (xx + dx) as usize;
                    s += gg * xv[(b * ci + c) * plane + q];
                }
            }
            *slot = s;
            if c == 0 && t == 0 {
                bias[o] = sb;
            }
        }
        self.put(db.0, db.1, &bias)?;
        Ok(dw)
    }

    /// The output as the value; the mean and inverse deviation written.
    fn batch_norm(
        &mut self,
        [mean, invstd, x, weight, bias]: [(u64, Dtype); 5],
        [n, c, plane]: [usize; 3],
        eps: f32,
    ) -> Value {
        let xv = self.all(x, n * c * plane)?;
        let (wv, bv) = (self.all(weight, c)?, self.all(bias, c)?);
        let count = n * plane;
        let at = |ch: usize, e: usize| (e / plane * c + ch) * plane + e % plane;
        let mut out = vec![0.0; xv.len()];
        let (mut means, mut invs) = (vec![0.0; c], vec![0.0; c]);
        for ch in 0..c {
            let mu = (0..count).map(|e| xv[at(ch, e)]).sum::<f32>() / count as f32;
            let q: f32 = (0..count).map(|e| (xv[at(ch, e)] - mu).powi(2)).sum();
            let inv = 1.0 / (q / count as f32 + eps).sqrt();
            for e in 0..count {
                out[at(ch, e)] = (xv[at(ch, e)] - mu) * inv * wv[ch] + bv[ch];
            }
            (means[ch], invs[ch]) = (mu, inv);
        }
        self.put(mean.0, mean.1, &means)?;
        self.put(invstd.0, invstd.1, &invs)?;
        Ok(out)
    }

    /// The input's gradient as the value; the weight's and bias's written.
    fn batch_norm_backward(
        &mut self,
        [dw, db, g, x, weight, mean, invstd]: [(u64, Dtype); 7],
        [n, c, plane]: [usize; 3],
    ) -> Value {
        let (gv, xv) = (self.all(g, n * c * plane)?, self.all(x, n * c * plane)?);
        let (wv, mv, iv) = (
            self.all(weight, c)?,
            self.all(mean, c)?,
            self.all(invstd, c)?,
        );
        let count = n * plane;
        let at = |ch: usize, e: usize| (e / plane * c + ch) * plane + e % plane;
        let mut dx = vec![0.0; xv.len()];
        let (mut dws, mut dbs) = (vec![0.0; c], vec![0.0; c]);
        for ch in 0..c {
            let xhat = |e: usize| (xv[at(ch, e)] - mv[ch]) * iv[ch];
            let sg: f32 = (0..count).map(|e| gv[at(ch, e)]).sum();
            let sgx: f32 = (0..count).map(|e| gv[at(ch, e)] * xhat(e)).sum();
            let scale = wv[ch] * iv[ch] / count as f32;
            for e in 0..count {
                dx[at(ch, e)] = scale * (count as f32 * gv[at(ch, e)] - sg - xhat(e) * sgx);
            }
            (dws[ch], dbs[ch]) = (sgx, sg);
        }
        self.put(dw.0, dw.1, &dws)?;
        self.put(db.0, db.1, &dbs)?;
        Ok(dx)
    }

    /// The maxima as the value; their indices written.
    fn max_pool2(
        &mut self,
        (indices, x): ((u64, Dtype), (u64, Dtype)),
        [planes, h, w]: [usize; 3],
    ) -> Value {
        let (oh, ow) = (h / 2, w / 2);
        let xv = self.all(x, planes * h * w)?;
        let (mut out, mut picked) = (Vec::new(), Vec::new());
        for i in 0..planes * oh * ow {
            let (p, r) = (i / (oh * ow), i % (oh * ow));
            let (base, first) = (p * h * w, 2 * (r / ow) * w + 2 * (r % ow));
            let window = [first, first + 1, first + w, first + w + 1];
            let (mut best, mut bv) = (window[0], xv[base + window[0]]);
            for &k in &window[1..] {
                let v = xv[base + k];
                if v > bv || v.is_nan() {
                    (best, bv) = (k, v);
                }
            }
            out.push(bv);
            picked.push(best as f32);
        }
        self.put(indices.0, indices.1, &picked)?;
        Ok(out)
    }

    fn max_pool2_backward(
        &mut self,
        (g, indices): ((u64, Dtype), (u64, Dtype)),
        [planes, h, w]: [usize; 3],
    ) -> Value {
        let (oh, ow) = (h / 2, w / 2);
        let (gv, iv) = (
            self.all(g, planes * oh * ow)?,
            self.all(indices, planes * oh * ow)?,
        );
        let out = (0..planes * h * w).map(|i| {
            let (p, q) = (i / (h * w), i % (h * w));
            let (oy, ox) = (q / w / 2, q % w / 2);
            let k = p * oh * ow + oy * ow + ox;
            let mine = oy < oh && ox < ow && iv[k] as usize == q;
            if mine {
                gv[k]
            } else {
                0.0
            }
        });
        Ok(out.collect())
    }
}

fn inside(y: i64, x: i64, h: usize, w: usize) -> bool {
    y >= 0 && x >= 0 && (y as usize) < h && (x as usize) < w
}

fn cnn() -> serde_json::Value {
    json!({"kind":"cnn","channels":2,"image_size":8,"blocks":2,"width":4,"classes":5})
}

/// The CNN's forward and backward computed by the device's kernels: its
/// losses are the CPU's within float32's rounding of sums in another
/// order, under float16 autocast within its rounding, and every op ran on
/// the device (the note says so).
#[test]
fn a_cnn_step_computed_by_the_devices_kernels_follows_the_cpu() {
    let features = 2 * 8 * 8;
    for extra in [json!({}), json!({"amp":"float16"})] {
        let cpu = losses(
            &mut super::kinds_tests::engine(cnn(), "adam", features, 5),
            &extra,
        );
        let (mut e, _) = on_device_with(&cnn(), (features, 5), None, Some(Kernels::Emulate));
        let device = losses(&mut e, &extra);
        let tolerance = if extra["amp"].is_string() { 1e-2 } else { 1e-5 };
        for (d, c) in device.iter().zip(&cpu) {
            let (d, c) = (d.expect("a loss"), c.expect("a loss"));
            assert!((d - c).abs() <= tolerance * c.abs(), "{extra}: {d} vs {c}");
        }
    }
    // Too big for the CPU: the step runs on the device alone.
    let (mut e, _) = on_device_with(&cnn(), (features, 5), None, Some(Kernels::Emulate));
    e.flop_limit = 0;
    let line = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2,"batch_size":8});
    let r = e.run_line(&line.to_string());
    assert!(r.ok, "{:?}", r.error);
    let note = r.note.expect("a train note");
    assert!(note.contains("computed on the GPU alone ("), "{note}");
}

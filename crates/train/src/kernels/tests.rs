use super::*;
use crate::kinds::step::{Arg, Batch};
use crate::optim::OptimizerKind;

/// Each kernel's parameters in the source, as the argument each takes.
fn declared() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out = vec![];
    for piece in SOURCE.split("__global__ void ").skip(1) {
        let (name, rest) = piece.split_once('(').unwrap();
        let (params, _) = rest.split_once(')').unwrap();
        let kinds = params
            .split(',')
            .map(|p| {
                let p = p.trim();
                match () {
                    _ if p.contains('*') => "ptr",
                    _ if p.starts_with("i64") => "i64",
                    _ if p.starts_with("int") => "i32",
                    _ if p.starts_with("float") => "f32",
                    _ => panic!("{name}: a parameter of another type: {p}"),
                }
            })
            .collect();
        out.push((name.trim(), kinds));
    }
    out
}

fn kind(arg: &K) -> &'static str {
    match arg {
        K::Ptr(_) => "ptr",
        K::I64(_) => "i64",
        K::I32(_) => "i32",
        K::F32(_) => "f32",
    }
}

#[test]
fn every_kernel_of_the_source_is_named_once() {
    let names: Vec<&str> = declared().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, NAMES);
}

const F32: Dtype = Dtype::Float32;

fn place(at: u64, shape: &'static [u64], dtype: Dtype) -> Place<'static> {
    Place { at, shape, dtype }
}

/// Every op the kernels compute, planned on small shapes: each launch
/// names a kernel of the source and passes what it declares, in order.
#[test]
fn every_launch_passes_what_its_kernel_declares() {
    let t = Arg::T(0);
    let x = place(0x1000, &[4, 6], F32);
    let half = place(0x1000, &[4, 6], Dtype::Float16);
    let row = place(0x2000, &[6], F32);
    let ids = place(0x3000, &[4], Dtype::Int64);
    let table = place(0x4000, &[10, 6], F32);
    let qkv = place(0x5000, &[1, 4, 6], F32);
    let head = place(0x6000, &[1, 2, 4, 1], F32);
    let stats = place(0x7000, &[4], F32);
    let scalar = place(0x8000, &[], F32);
    let image = place(0xa000, &[2, 3, 4, 4], F32);
    let kernel = place(0xb000, &[5, 3, 3, 3], F32);
    let maps = place(0xc000, &[2, 5, 4, 4], F32);
    let five = place(0xd000, &[5], F32);
    let three = place(0xe000, &[3], F32);
    let pooled = place(0xf000, &[2, 3, 2, 2], F32);
    let picked = place(0x10000, &[2, 3, 2, 2], Dtype::Int64);
    let proj = place(0x11000, &[2, 4, 12], F32);
    let attended = place(0x12000, &[2, 4, 4], F32);
    let lse = place(0x13000, &[2, 2, 32], F32);
    let heads2 = place(0x14000, &[2, 2, 4, 2], F32);
    let sdpa_back = |packed: bool| match packed {
        true => Calc::SdpaBackwardPacked {
            grad: t,
            qkv: t,
            out: t,
            lse: t,
        },
        false => Calc::SdpaBackward {
            grad: t,
            qkv: t,
            out: t,
            lse: t,
        },
    };
    let conv_back = |input_grad| Calc::ConvBackward {
        grad: t,
        x: t,
        weight: t,
        input_grad,
    };
    let cases: Vec<(Calc, Place, Vec<Place>, Vec<Place>)> = vec![
        (
            Calc::Sdpa {
                qkv: t,
                heads: 2,
                lse_align: 32,
            },
            attended,
            vec![lse],
            vec![proj],
        ),
        (
            sdpa_back(false),
            heads2,
            vec![heads2, heads2],
            vec![attended, proj, attended, lse],
        ),
        (
            sdpa_back(true),
            proj,
            vec![],
            vec![attended, proj, attended, lse],
        ),
        (
            Calc::Conv {
                x: t,
                weight: t,
                bias: t,
            },
            maps,
            vec![],
            vec![image, kernel, five],
        ),
        (
            conv_back(true),
            image,
            vec![kernel, five],
            vec![maps, image, kernel],
        ),
        (
            conv_back(false),
            kernel,
            vec![five],
            vec![maps, image, kernel],
        ),
        (
            Calc::BatchNorm {
                x: t,
                weight: t,
                bias: t,
            },
            image,
            vec![three, three],
            vec![image, three, three],
        ),
        (
            Calc::BatchNormBackward {
                grad: t,
                x: t,
                weight: t,
                mean: t,
                invstd: t,
            },
            image,
            vec![three, three],
            vec![image, image, three, three, three],
        ),
        (Calc::MaxPool(t), pooled, vec![picked], vec![image]),
        (
            Calc::MaxPoolBackward {
                grad: t,
                indices: t,
            },
            image,
            vec![],
            vec![pooled, picked],
        ),
        (Calc::Ones, x, vec![], vec![]),
        (Calc::Zeros, x, vec![], vec![]),
        (Calc::Workspace, x, vec![], vec![]),
        (Calc::Arange, row, vec![], vec![]),
        (Calc::Copy(t), x, vec![], vec![x]),
        (Calc::Scale(t, 0.5), x, vec![], vec![x]),
        (Calc::Sqrt(t), x, vec![], vec![x]),
        (Calc::Not(t), x, vec![], vec![x]),
        (Calc::Relu(t), x, vec![], vec![x]),
        (Calc::Gelu(t), x, vec![], vec![x]),
        (
            Calc::ReluBackward { grad: t, out: t },
            x,
            vec![],
            vec![x, x],
        ),
        (Calc::GeluBackward { grad: t, x: t }, x, vec![], vec![x, x]),
        (Calc::Add(t, t), x, vec![], vec![x, row]),
        (Calc::Sum(t), row, vec![], vec![x]),
        (Calc::Tril(t), place(0, &[6, 6], F32), vec![], vec![]),
        (
            Calc::MaskedFill {
                x: t,
                mask: t,
                value: -1.0,
            },
            x,
            vec![],
            vec![x, row],
        ),
        (
            Calc::Embedding { weight: t, ids: t },
            x,
            vec![],
            vec![table, ids],
        ),
        (
            Calc::EmbeddingBackward { grad: t, ids: t },
            table,
            vec![],
            vec![x, ids],
        ),
        (Calc::Softmax(t), x, vec![], vec![x]),
        (Calc::LogSoftmax(t), x, vec![], vec![x]),
        // float16 rows: a block a row
        (Calc::Softmax(t), x, vec![], vec![half]),
        (
            Calc::SoftmaxBackward { grad: t, out: t },
            half,
            vec![],
            vec![x, x],
        ),
        (
            Calc::SoftmaxBackward { grad: t, out: t },
            x,
            vec![],
            vec![x, x],
        ),
        (
            Calc::LogSoftmaxBackward { grad: t, out: t },
            x,
            vec![],
            vec![x, x],
        ),
        (
            Calc::Nll {
                log_probs: t,
                targets: Arg::Batch(Batch::Targets),
            },
            scalar,
            vec![scalar],
            vec![x, ids],
        ),
        (
            Calc::NllBackward {
                grad: t,
                targets: t,
                total_weight: t,
            },
            x,
            vec![],
            vec![scalar, ids, scalar],
        ),
        (Calc::Heads { x: t, part: 1 }, head, vec![], vec![qkv]),
        (
            Calc::MergeHeads(t),
            place(0, &[1, 4, 2], F32),
            vec![],
            vec![head],
        ),
        (Calc::Cat([t; 3]), qkv, vec![], vec![head, head, head]),
        (
            Calc::Norm {
                x: t,
                weight: t,
                bias: Some(t),
            },
            x,
            vec![stats, stats],
            vec![x, row, row],
        ),
        (
            Calc::Norm {
                x: t,
                weight: t,
                bias: None,
            },
            x,
            vec![stats],
            vec![x, row],
        ),
        (
            Calc::NormBackward {
                grad: t,
                x: t,
                mean: Some(t),
                rstd: t,
                weight: t,
            },
            x,
            vec![row, row],
            vec![x, x, stats, stats, row],
        ),
        (
            Calc::Linear {
                x: t,
                weight: t,
                bias: t,
            },
            place(0, &[4, 10], F32),
            vec![],
            vec![x, place(0, &[10, 6], F32), place(0, &[10], F32)],
        ),
    ];
    let declared = declared();
    let mut used = std::collections::BTreeSet::new();
    let mut planned: Vec<(String, Vec<Call>)> = vec![];
    for (calc, out, parts, args) in cases {
        let calls = plan(&calc, out, &parts, &args, None)
            .unwrap_or_else(|| panic!("{calc:?}: no kernel planned"));
        assert!(has_kernel(&calc), "{calc:?}");
        planned.push((format!("{calc:?}"), calls));
    }
    let set = Synthetic {
        samples: 100,
        features: 6,
        classes: 10,
        seed: 3,
    };
    let labels = place(0x9000, &[4], Dtype::Int64);
    let more = [
        ("init", vec![init(x, Init::Uniform(0.5), 1, 2)]),
        ("batch", vec![batch(false, [x, labels], &set, (5, 4))]),
        ("sequences", vec![batch(true, [x, x], &set, (5, 4))]),
        (
            "sgd",
            vec![update(OptimizerKind::Momentum, (x, x), &[x], 1, 0.1).unwrap()],
        ),
        (
            "adam",
            vec![update(OptimizerKind::Adamw, (x, x), &[x, x], 3, 0.1).unwrap()],
        ),
    ];
    planned.extend(more.map(|(what, calls)| (what.to_string(), calls)));
    for (calc, calls) in planned {
        for call in calls {
            let Call::Launch(l) = call else { continue };
            let (_, params) = declared
                .iter()
                .find(|(n, _)| *n == l.kernel)
                .unwrap_or_else(|| panic!("{calc}: no kernel {}", l.kernel));
            let passed: Vec<&str> = l.args.iter().map(kind).collect();
            assert_eq!(&passed, params, "{calc}: {}", l.kernel);
            used.insert(l.kernel);
        }
    }
    assert_eq!(
        used.len(),
        NAMES.len(),
        "every kernel is planned by some op"
    );
}

/// cuBLAS's `GemmEx`, column-major, over float32 buffers by address.
fn reference_gemm(g: &GemmEx, memory: &mut std::collections::BTreeMap<u64, Vec<f32>>) {
    let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
    for batch in 0..g.batch as usize {
        let a = |i: usize, p: usize| {
            let ld = g.a.ld as usize;
            let base = batch * g.a.stride as usize;
            memory[&g.a.at][base + if g.transa { i * ld + p } else { p * ld + i }]
        };
        let b = |p: usize, j: usize| {
            let ld = g.b.ld as usize;
            let base = batch * g.b.stride as usize;
            memory[&g.b.at][base + if g.transb { p * ld + j } else { j * ld + p }]
        };
        let mut c = memory[&g.c.at].clone();
        for i in 0..m {
            for j in 0..n {
                let at = batch * g.c.stride as usize + j * g.c.ld as usize + i;
                let sum: f32 = (0..k).map(|p| a(i, p) * b(p, j)).sum();
                c[at] = g.alpha * sum + g.beta * c[at];
            }
        }
        memory.insert(g.c.at, c);
    }
}

/// Row-major `op(a) · op(b)`, batched.
fn row_major(
    a: &[f32],
    b: &[f32],
    (batch, m, k, n): (usize, usize, usize, usize),
    ta: bool,
    tb: bool,
) -> Vec<f32> {
    let mut out = vec![0.0; batch * m * n];
    for z in 0..batch {
        for i in 0..m {
            for j in 0..n {
                out[z * m * n + i * n + j] = (0..k)
                    .map(|p| {
                        let x = if ta {
                            a[z * m * k + p * m + i]
                        } else {
                            a[z * m * k + i * k + p]
                        };
                        let y = if tb {
                            b[z * k * n + j * k + p]
                        } else {
                            b[z * k * n + p * n + j]
                        };
                        x * y
                    })
                    .sum();
            }
        }
    }
    out
}

/// The row-major product as one column-major cuBLAS call, for every
/// transposition, batched and not.
#[test]
fn a_row_major_product_is_the_column_major_call_on_swapped_operands() {
    let (m, k, n) = (3usize, 4usize, 5usize);
    for batch in [1usize, 2] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let a_shape: Vec<u64> = match ta {
                false => vec![batch as u64, m as u64, k as u64],
                true => vec![batch as u64, k as u64, m as u64],
            };
            let b_shape: Vec<u64> = match tb {
                false => vec![batch as u64, k as u64, n as u64],
                true => vec![batch as u64, n as u64, k as u64],
            };
            let out_shape = vec![batch as u64, m as u64, n as u64];
            let a: Vec<f32> = (0..batch * m * k)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let b: Vec<f32> = (0..batch * k * n)
                .map(|i| (i as f32 * 0.11).cos())
                .collect();
            let place = |at, shape: &[u64]| Place {
                at,
                shape: Box::leak(shape.to_vec().into_boxed_slice()),
                dtype: F32,
            };
            let calc = Calc::Mm {
                a: Arg::T(0),
                b: Arg::T(1),
                ta,
                tb,
                batched: batch > 1,
            };
            let (pa, pb) = (place(1, &a_shape), place(2, &b_shape));
            let pc = place(3, &out_shape);
            let calls = plan(&calc, pc, &[], &[pa, pb], Some((9, 64))).unwrap();
            let [Call::Gemm(g)] = calls.as_slice() else {
                panic!("one product: {calls:?}")
            };
            assert_eq!(g.workspace, Some((9, 64)));
            let mut memory = std::collections::BTreeMap::from([
                (1, a.clone()),
                (2, b.clone()),
                (3, vec![0.0; batch * m * n]),
            ]);
            reference_gemm(g, &mut memory);
            let want = row_major(&a, &b, (batch, m, k, n), ta, tb);
            for (have, want) in memory[&3].iter().zip(&want) {
                assert!((have - want).abs() < 1e-5, "ta {ta} tb {tb} batch {batch}");
            }
        }
    }
}

/// `nn.Linear`: the bias in every row, then `x · Wᵀ` added (beta 1).
#[test]
fn a_linear_layer_is_its_bias_rows_then_the_product_added() {
    let x = place(1, &[2, 3], F32);
    let w = place(2, &[4, 3], F32);
    let b = place(3, &[4], F32);
    let out = place(4, &[2, 4], Dtype::Bfloat16);
    let calc = Calc::Linear {
        x: Arg::T(0),
        weight: Arg::Param(0),
        bias: Arg::Param(1),
    };
    let calls = plan(&calc, out, &[], &[x, w, b], None).unwrap();
    let [Call::Launch(fill), Call::Gemm(g)] = calls.as_slice() else {
        panic!("{calls:?}")
    };
    assert_eq!(fill.kernel, "bias_rows");
    assert_eq!(fill.args[..4], [K::Ptr(4), K::I32(2), K::Ptr(3), K::I32(0)]);
    assert_eq!(
        (g.m, g.n, g.k, g.transa, g.transb, g.beta),
        (4, 2, 3, true, false, 1.0)
    );
    assert_eq!((g.a.at, g.b.at, g.c.at), (2, 1, 4));
    assert_eq!((g.a.ld, g.b.ld, g.c.ld), (3, 3, 4));
}

/// What no kernel computes here is left to the host, as are operands that
/// do not fit (the CPU names the fault).
#[test]
fn ops_without_a_kernel_or_with_misfit_operands_are_not_planned() {
    let t = Arg::T(0);
    let x = place(1, &[4, 6], F32);
    // Pooling reads maps (N x C x H x W), and writes its indices too.
    assert_eq!(plan(&Calc::MaxPool(t), x, &[x], &[x], None), None);
    let maps = place(1, &[1, 2, 4, 4], F32);
    assert_eq!(plan(&Calc::MaxPool(t), x, &[], &[maps], None), None);
    let sdpa = Calc::Sdpa {
        qkv: t,
        heads: 2,
        lse_align: 1,
    };
    // A sequence longer than a block holds the scores of runs on the host.
    let long = place(1, &[1, attention::ATTN_ROW + 1, 4], F32);
    let projection = place(1, &[1, attention::ATTN_ROW + 1, 12], F32);
    let lse = place(1, &[1, 2, attention::ATTN_ROW + 1], F32);
    assert_eq!(plan(&sdpa, long, &[lse], &[projection], None), None);
    assert!(has_kernel(&sdpa) && !has_kernel(&Calc::DynamicMap { signed: true }));
    // Adam keeps two tensors a parameter; a misfit state is not updated.
    assert_eq!(update(OptimizerKind::Adam, (x, x), &[x], 1, 0.1), None);
    assert_eq!(
        update(OptimizerKind::Sgd, (x, place(1, &[3], F32)), &[], 1, 0.1),
        None
    );
    let conv = Calc::Conv {
        x: t,
        weight: t,
        bias: t,
    };
    assert_eq!(plan(&conv, x, &[], &[x, x, x], None), None);
    assert_eq!(
        plan(&Calc::Relu(t), x, &[], &[place(1, &[5], F32)], None),
        None
    );
    let mm = Calc::mm(t, t, false, false);
    assert_eq!(plan(&mm, x, &[], &[x, x], None), None, "4x6 · 4x6");
    // A bfloat16 table cannot take float32 atomics.
    let table = place(2, &[10, 6], Dtype::Bfloat16);
    let ids = place(3, &[4], Dtype::Int64);
    let calc = Calc::EmbeddingBackward { grad: t, ids: t };
    assert_eq!(plan(&calc, table, &[], &[x, ids], None), None);
}

#[test]
fn grids_cover_their_elements_or_rows() {
    assert_eq!(Grid::Elements(0).blocks(), 1);
    assert_eq!(Grid::Elements(256).blocks(), 1);
    assert_eq!(Grid::Elements(257).blocks(), 2);
    assert_eq!(
        Grid::Elements(u64::MAX).blocks(),
        vramlab_device::compute::MAX_BLOCKS
    );
    assert_eq!(Grid::Rows(1000).blocks(), 1000);
}

/// A `#define` of the source, as a number.
fn defined(name: &str) -> u64 {
    let line = SOURCE
        .lines()
        .find(|l| l.starts_with(&format!("#define {name} ")))
        .unwrap_or_else(|| panic!("no #define {name}"));
    let value = line.split_whitespace().nth(2).unwrap();
    match value {
        "(THREADS" => {
            // `(THREADS / N)`
            let n: u64 = line
                .split('/')
                .nth(1)
                .unwrap()
                .trim_end_matches(')')
                .trim()
                .parse()
                .unwrap();
            u64::from(vramlab_device::compute::BLOCK_THREADS) / n
        }
        v => v.parse().unwrap(),
    }
}

#[test]
fn the_planners_block_shapes_are_the_sources() {
    assert_eq!(
        defined("THREADS"),
        u64::from(vramlab_device::compute::BLOCK_THREADS)
    );
    assert_eq!(defined("COLS"), COLS);
    assert_eq!(defined("WARP_ROW"), WARP_ROW);
    assert_eq!(defined("WARP_ROWS"), WARP_ROWS);
}

#[test]
fn short_softmax_rows_go_a_warp_each_and_long_ones_a_block_each() {
    let launch = |calc: &Calc, out: Place<'static>, args: &[Place<'static>]| match plan(
        calc,
        out,
        &[],
        args,
        None,
    )
    .unwrap()
    .remove(0)
    {
        Call::Launch(l) => l,
        other => panic!("{other:?}"),
    };
    let softmax = Calc::Softmax(Arg::T(0));
    let x = place(0x1000, &[20, 1024], F32);
    let l = launch(&softmax, x, &[x]);
    assert_eq!(
        (l.kernel, l.grid),
        ("softmax_warps", Grid::Rows(3)),
        "8 rows a block"
    );
    assert_eq!(l.args[4..], [K::I64(1024), K::I64(20), K::I32(0)]);
    let bf16 = place(0x1000, &[20, 1024], Dtype::Bfloat16);
    assert_eq!(launch(&softmax, x, &[bf16]).kernel, "softmax_warps");
    let half = place(0x1000, &[20, 1024], Dtype::Float16);
    let l = launch(&softmax, x, &[half]);
    assert_eq!(
        (l.kernel, l.grid),
        ("softmax", Grid::Rows(20)),
        "float16: a block a row"
    );
    assert_eq!(l.args[4..], [K::I64(1024), K::I32(0)]);
    let long = place(0x1000, &[20, 1025], F32);
    let l = launch(&Calc::LogSoftmax(Arg::T(0)), long, &[long]);
    assert_eq!((l.kernel, l.grid), ("softmax", Grid::Rows(20)));
    assert_eq!(l.args[4..], [K::I64(1025), K::I32(1)]);
    let back = Calc::SoftmaxBackward {
        grad: Arg::T(0),
        out: Arg::T(1),
    };
    let l = launch(&back, x, &[x, bf16]);
    assert_eq!(
        (l.kernel, l.grid),
        ("softmax_backward_warps", Grid::Rows(3))
    );
    assert_eq!(l.args[6..], [K::I64(1024), K::I64(20), K::I32(0)]);
    let l = launch(&back, half, &[x, x]);
    assert_eq!((l.kernel, l.grid), ("softmax_backward", Grid::Rows(20)));
    let cols = place(0x1000, &[4, 20], F32);
    let l = launch(&Calc::Sum(Arg::T(0)), place(0x2000, &[20], F32), &[cols]);
    assert_eq!(
        (l.kernel, l.grid),
        ("sum_rows", Grid::Rows(3)),
        "20 columns, 8 a block"
    );
}

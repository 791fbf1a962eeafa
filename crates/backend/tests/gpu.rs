//! On a real NVIDIA GPU only; elsewhere these are ignored. Run them with
//! `cargo test -p vramlab-server --test gpu -- --ignored` on a machine with a
//! GPU and its driver (the release test binary can be carried there).

use vramlab_backend::cuda::driver::CudaDevice;
use vramlab_backend::{select, DeviceChoice};
use vramlab_shared::device::Device;
use vramlab_shared::framework::Settings;
use vramlab_shared::units::MIB;
use vramlab_shared::Engine;

/// A kernel on GPU 0, or on the simulated GPU.
fn engine(choice: DeviceChoice) -> Engine {
    select(choice, 0)
        .expect("backend")
        .engine()
        .expect("engine")
}

#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn a_segment_is_device_memory_the_driver_sees_taken_and_given_back() {
    // No smaller GPU asked for: the device is the real one.
    let real = Settings {
        device_total_bytes: u64::MAX,
        ..Settings::default()
    };
    let mut device = CudaDevice::start(0, &real).expect("a CUDA GPU");
    let (before, total) = device.mem_get_info();
    assert_eq!(total, device.info().total_bytes);
    let address = device.malloc(256 * MIB).expect("256 MiB on an idle GPU");
    let (during, _) = device.mem_get_info();
    assert!(
        before - during >= 256 * MIB,
        "cuMemAlloc of 256 MiB took {} bytes",
        before - during
    );
    assert_eq!(device.segment_bytes(), 256 * MIB);
    device.free(address, 256 * MIB);
    assert_eq!(device.segment_bytes(), 0);
    assert_eq!(device.mem_get_info().0, before);
}

/// Set to a 1 GiB card with a 300 MiB context, the GPU stands in for it:
/// that card's total and free bytes, and a request beyond its room is
/// refused as out of memory without reaching the driver.
#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn a_real_gpu_stands_in_for_a_smaller_card() {
    let small = Settings {
        device_total_bytes: 1024 * MIB,
        context_bytes: 300 * MIB,
        ..Settings::default()
    };
    let mut device = CudaDevice::start(0, &small).expect("a CUDA GPU");
    assert_eq!(device.mem_get_info(), (724 * MIB, 1024 * MIB));
    assert_eq!(device.info().total_bytes, 1024 * MIB);
    assert!(device
        .info()
        .name
        .contains("standing in for a 1024.00 MiB GPU"));
    let address = device.malloc(700 * MIB).expect("700 MiB fit in 724");
    assert_eq!(device.mem_get_info(), (24 * MIB, 1024 * MIB));
    assert!(
        device.malloc(25 * MIB).is_err(),
        "25 MiB beyond the card's room"
    );
    device.free(address, 700 * MIB);
    assert_eq!(device.mem_get_info().0, 724 * MIB);
}

/// The allocator decides, not the device: the same commands give the same
/// allocated and reserved bytes on the GPU as on the simulator.
#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn the_engine_counts_the_same_bytes_on_the_gpu_as_on_the_simulator() {
    let lines = [
        r#"{"cmd":"alloc","name":"x","bytes":1000000}"#,
        r#"{"cmd":"alloc","name":"y","bytes":30000000}"#,
        r#"{"cmd":"del","name":"x"}"#,
        r#"{"cmd":"model","name":"model","layers":2,"width":512}"#,
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}"#,
        r#"{"cmd":"data","name":"data"}"#,
        r#"{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2}"#,
        r#"{"cmd":"empty_cache"}"#,
    ];
    let (mut gpu, mut sim) = (engine(DeviceChoice::Cuda), engine(DeviceChoice::Sim));
    for line in lines {
        let (g, s) = (gpu.run_line(line), sim.run_line(line));
        assert!(g.ok && s.ok, "{line}: {:?} / {:?}", g.error, s.error);
        assert_eq!(g.stats.allocated_bytes, s.stats.allocated_bytes, "{line}");
        assert_eq!(g.stats.reserved_bytes, s.stats.reserved_bytes, "{line}");
    }
}

/// Every kind's step computed by the GPU's own kernels and cuBLAS: the
/// loss follows the CPU interpreter's for the same seed (float32 within
/// 1e-5 of it, autocast's bfloat16 and float16 within 1e-2), never NaN,
/// with the same memory numbers as the simulator; the note says how many
/// ops the GPU computed. Prints each case's losses and note.
#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn each_kinds_step_is_computed_by_the_gpus_kernels_and_follows_the_cpu() {
    let mlp = r#""kind":"mlp","layers":3,"width":256,"input_dim":64,"classes":10"#;
    let gpt = r#""kind":"transformer","layers":2,"width":32,"heads":2,"seq_len":16,"vocab":64"#;
    let cnn = r#""kind":"cnn","channels":3,"image_size":16,"blocks":2,"width":8,"classes":10"#;
    let cases = [
        (mlp, (64, 10), r#","batch_size":16"#, 1e-5),
        (mlp, (64, 10), r#","batch_size":16,"amp":"bfloat16""#, 1e-2),
        (
            mlp,
            (64, 10),
            r#","batch_size":16,"amp":"float16","accumulate":2"#,
            1e-2,
        ),
        (
            mlp,
            (64, 10),
            r#","batch_size":16,"checkpointing":true"#,
            1e-5,
        ),
        (gpt, (16, 64), r#","batch_size":4"#, 1e-5),
        (
            gpt,
            (16, 64),
            r#","batch_size":4,"amp":"bfloat16","checkpointing":true"#,
            1e-2,
        ),
        (cnn, (3 * 16 * 16, 10), r#","batch_size":16"#, 1e-5),
        (
            cnn,
            (3 * 16 * 16, 10),
            r#","batch_size":16,"amp":"float16""#,
            1e-2,
        ),
        (gpt, (16, 64), r#","batch_size":4,"attention":"sdpa""#, 1e-5),
        (
            gpt,
            (16, 64),
            r#","batch_size":4,"attention":"sdpa","amp":"bfloat16""#,
            1e-2,
        ),
    ];
    for (model, (features, classes), extra, tolerance) in cases {
        let lines = [
            format!(r#"{{"cmd":"model","name":"model",{model}}}"#),
            r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}"#.to_string(),
            format!(
                r#"{{"cmd":"data","name":"data","samples":512,"features":{features},"classes":{classes}}}"#
            ),
            format!(
                r#"{{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":3{extra}}}"#
            ),
        ];
        let (mut gpu, mut sim) = (engine(DeviceChoice::Cuda), engine(DeviceChoice::Sim));
        let mut last = None;
        for line in &lines {
            let (g, s) = (gpu.run_line(line), sim.run_line(line));
            assert!(g.ok && s.ok, "{line}: {:?} / {:?}", g.error, s.error);
            assert_eq!(g.stats.allocated_bytes, s.stats.allocated_bytes, "{line}");
            assert_eq!(g.stats.reserved_bytes, s.stats.reserved_bytes, "{line}");
            last = Some((g, s));
        }
        let (g, s) = last.unwrap();
        let note = g.note.clone().unwrap_or_default();
        let losses = |r: &vramlab_shared::protocol::StepRecord| -> Vec<Option<f64>> {
            let steps = r.value.as_ref().unwrap()["steps"]
                .as_array()
                .unwrap()
                .clone();
            steps.iter().map(|s| s["loss"].as_f64()).collect()
        };
        let (on_gpu, on_cpu) = (losses(&g), losses(&s));
        eprintln!("{model}{extra}: GPU {on_gpu:?} CPU {on_cpu:?}\n  {note}");
        let on_gpu: Vec<f64> = on_gpu.into_iter().map(|l| l.expect("a loss")).collect();
        let on_cpu: Vec<f64> = on_cpu.into_iter().map(|l| l.expect("a loss")).collect();
        assert!(
            note.contains("computed on the GPU ("),
            "{model}{extra}: {note}"
        );
        for (a, b) in on_gpu.iter().zip(&on_cpu) {
            assert!(a.is_finite(), "{model}{extra}: {a}");
            assert!(
                (a - b).abs() <= tolerance * b.abs(),
                "{model}{extra}: {a} vs {b}"
            );
        }
    }
}

/// vramlab's side of the speed ratio, on the same GPU as
/// `tests/reference/gpu_speed.py`'s PyTorch eager side: a training step
/// (forward, backward, Adam) of the default MLP (2 x 128, input 784,
/// batch 64; checked against the CPU op by op, and on the GPU alone) and
/// of an 8 x 8192 MLP in bfloat16 at batch 1024 and of the 12 x 768
/// transformer at batch 8, sequence 1024 under bfloat16 autocast with its
/// attention written out, and fused (vramlab's own kernel, a row a
/// block), each on the GPU alone: the
/// mean of 20 timed steps after 5 warm-up steps, each step's loss read
/// back (so the time is the GPU's and the engine's, end to end). Prints
/// one JSON line a case.
#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn the_speed_of_a_step_on_the_gpu() {
    /// A case: its name, the model's fields, the data's features and
    /// classes, the batch, the train command's other fields, and whether
    /// each op is held to the CPU's.
    struct Case {
        name: &'static str,
        model: &'static str,
        data: (u64, u64),
        batch: u64,
        train: &'static str,
        checked: bool,
    }
    let mlp = r#""layers":2,"width":128,"input_dim":784,"classes":10"#;
    let cases = [
        Case {
            name: "mlp 2x128 batch 64, checked",
            model: mlp,
            data: (784, 10),
            batch: 64,
            train: "",
            checked: true,
        },
        Case {
            name: "mlp 2x128 batch 64",
            model: mlp,
            data: (784, 10),
            batch: 64,
            train: "",
            checked: false,
        },
        Case {
            name: "mlp 8x8192 batch 1024 bf16",
            model: r#""layers":8,"width":8192,"input_dim":8192,"classes":8192,"dtype":"bfloat16""#,
            data: (8192, 8192),
            batch: 1024,
            train: "",
            checked: false,
        },
        Case {
            name: "transformer 12x768 batch 8 seq 1024 bf16 autocast, eager attention",
            model: r#""kind":"transformer","layers":12,"width":768,"heads":12,"seq_len":1024,"vocab":50257"#,
            data: (1024, 50257),
            batch: 8,
            train: r#","amp":"bfloat16""#,
            checked: false,
        },
        Case {
            name: "transformer 12x768 batch 8 seq 1024 bf16 autocast, fused attention",
            model: r#""kind":"transformer","layers":12,"width":768,"heads":12,"seq_len":1024,"vocab":50257"#,
            data: (1024, 50257),
            batch: 8,
            train: r#","amp":"bfloat16","attention":"sdpa""#,
            checked: false,
        },
    ];
    for c in cases {
        let Case {
            name: case,
            model,
            data: (features, classes),
            batch,
            train: extra,
            checked,
        } = c;
        let mut gpu = select(DeviceChoice::Cuda, 0)
            .expect("backend")
            .engine()
            .expect("engine");
        if !checked {
            gpu.set_arithmetic_flop_limit(0);
        }
        let lines = [
            r#"{"cmd":"restart","framework":"pytorch","gpu":"h100-80gb"}"#.to_string(),
            format!(r#"{{"cmd":"model","name":"model",{model}}}"#),
            r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}"#.to_string(),
            format!(
                r#"{{"cmd":"data","name":"data","samples":4096,"features":{features},"classes":{classes}}}"#
            ),
        ];
        for line in &lines {
            let r = gpu.run_line(line);
            assert!(r.ok, "{line}: {:?}", r.error);
        }
        let train = |steps: u32| {
            format!(
                r#"{{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":{steps},"batch_size":{batch}{extra}}}"#
            )
        };
        let warm = gpu.run_line(&train(5));
        assert!(warm.ok, "{case}: {:?}", warm.error);
        let start = std::time::Instant::now();
        let timed = gpu.run_line(&train(20));
        let seconds = start.elapsed().as_secs_f64() / 20.0;
        assert!(timed.ok, "{case}: {:?}", timed.error);
        let note = timed.note.clone().unwrap_or_default();
        let steps = timed
            .value
            .as_ref()
            .map(|v| v["steps"].clone())
            .unwrap_or_default();
        let loss = steps
            .as_array()
            .and_then(|s| s.last())
            .map(|s| s["loss"].clone());
        let params: f64 = match features {
            784 => [784.0, 128.0, 128.0, 10.0]
                .windows(2)
                .map(|w| w[0] * w[1] + w[1])
                .sum(),
            8192 => [8192.0; 10].windows(2).map(|w| w[0] * w[1] + w[1]).sum(),
            // GPT-2 small, its head tied to the embedding (gpu_speed.py's count).
            _ => 124_439_808.0,
        };
        let tokens = if features == 1024 { 1024 } else { 1 };
        let flops = 6.0 * params * (batch * tokens) as f64;
        println!(
            "{}",
            serde_json::json!({
                "case": case,
                "seconds": seconds,
                "parameters": params,
                "model_tflops": flops / seconds / 1e12,
                "last_loss": loss,
                "note": note,
            })
        );
        assert!(note.contains("computed on the GPU"), "{case}: {note}");
    }
}

/// Expandable segments on the driver's virtual memory: a reserved range
/// takes nothing, each page mapped into it takes its bytes from the
/// driver and holds values at the range's addresses, unmapping gives
/// them back.
#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn an_expandable_segment_maps_pages_into_one_reserved_range() {
    use vramlab_shared::device::DeviceMemory;
    let real = Settings {
        device_total_bytes: u64::MAX,
        ..Settings::default()
    };
    let mut device = CudaDevice::start(0, &real).expect("a CUDA GPU");
    let (before, _) = device.mem_get_info();
    let base = device.reserve(1 << 30, 0).expect("a 1 GiB range");
    assert_eq!(device.mem_get_info().0, before, "a range takes no memory");
    let page = 20 * MIB;
    let first = device.map(base, page).expect("a page");
    let second = device.map(base + page, page).expect("the next page");
    assert!(before - device.mem_get_info().0 >= 2 * page);
    assert_eq!(device.segment_bytes(), 2 * page);
    // A value across the two pages, read back.
    let bytes: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    device
        .write(base + page - 2048, &bytes)
        .expect("written across pages");
    let mut back = vec![0u8; bytes.len()];
    device
        .read(base + page - 2048, &mut back)
        .expect("read back");
    assert_eq!(back, bytes);
    assert!(
        device.read(base + 2 * page, &mut back).is_err(),
        "past the pages"
    );
    device.unmap(base + page, second, page);
    device.unmap(base, first, page);
    assert_eq!(device.segment_bytes(), 0);
    assert_eq!(device.mem_get_info().0, before);
}

/// With `expandable_segments:True` the engine's numbers on the GPU are
/// the simulator's, command by command, and a step computed by the
/// kernels in the mapped pages follows the CPU.
#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn expandable_segments_count_and_compute_as_on_the_simulator() {
    let lines = [
        r#"{"cmd":"restart","framework":"pytorch","expandable_segments":true}"#,
        r#"{"cmd":"alloc","name":"x","bytes":100000000}"#,
        r#"{"cmd":"alloc","name":"y","bytes":30000000}"#,
        r#"{"cmd":"del","name":"x"}"#,
        r#"{"cmd":"empty_cache"}"#,
        r#"{"cmd":"model","name":"model","layers":3,"width":256,"input_dim":64,"classes":10}"#,
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}"#,
        r#"{"cmd":"data","name":"data","samples":512,"features":64,"classes":10}"#,
        r#"{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":3,"batch_size":16}"#,
        r#"{"cmd":"del","name":"y"}"#,
        r#"{"cmd":"empty_cache"}"#,
    ];
    let (mut gpu, mut sim) = (engine(DeviceChoice::Cuda), engine(DeviceChoice::Sim));
    for line in lines {
        let (g, s) = (gpu.run_line(line), sim.run_line(line));
        assert!(g.ok && s.ok, "{line}: {:?} / {:?}", g.error, s.error);
        assert_eq!(g.stats.allocated_bytes, s.stats.allocated_bytes, "{line}");
        assert_eq!(g.stats.reserved_bytes, s.stats.reserved_bytes, "{line}");
        if line.contains("\"train\"") {
            let note = g.note.clone().unwrap_or_default();
            eprintln!("expandable segments: {note}");
            assert!(note.contains("computed on the GPU ("), "{note}");
            let loss = |r: &vramlab_shared::protocol::StepRecord| {
                r.value.as_ref().unwrap()["steps"][2]["loss"]
                    .as_f64()
                    .unwrap()
            };
            assert!((loss(&g) - loss(&s)).abs() <= 1e-5 * loss(&s).abs());
        }
    }
}

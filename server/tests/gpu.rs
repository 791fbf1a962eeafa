//! On a real NVIDIA GPU only; elsewhere these are ignored. Run them with
//! `cargo test -p vramlab-server --test gpu -- --ignored` on a machine with a
//! GPU and its driver (the release test binary can be carried there).

use vramlab_server::backend::{select, DeviceChoice};
use vramlab_server::cuda::driver::CudaDevice;
use vramlab_shared::device::Device;
use vramlab_shared::framework::Settings;
use vramlab_shared::units::MIB;
use vramlab_shared::Engine;

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
    let engine = |choice| -> Engine {
        select(choice, 0)
            .expect("backend")
            .engine()
            .expect("engine")
    };
    let (mut gpu, mut sim) = (engine(DeviceChoice::Cuda), engine(DeviceChoice::Sim));
    for line in lines {
        let (g, s) = (gpu.run_line(line), sim.run_line(line));
        assert!(g.ok && s.ok, "{line}: {:?} / {:?}", g.error, s.error);
        assert_eq!(g.stats.allocated_bytes, s.stats.allocated_bytes, "{line}");
        assert_eq!(g.stats.reserved_bytes, s.stats.reserved_bytes, "{line}");
    }
}

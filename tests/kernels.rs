//! The training step's GPU kernels compile, with NVRTC and no GPU, for
//! every compute capability vramlab runs on (`vramlab kernels`, as a GPU
//! run compiles them), and each cubin holds every kernel the planner
//! launches. NVRTC comes from CUDA 13.0's nvidia-cuda-nvrtc wheel
//! (scripts/setup puts it in tools/nvrtc); skipped where it is missing,
//! unless VRAMLAB_REQUIRE_NVRTC is set (the test command sets it).

use std::process::Command;
use vramlab_shared::train::kernels::NAMES;
use vramlab_tests::{root, vramlab_bin};

#[test]
fn the_kernels_compile_for_turing_ampere_ada_and_hopper() {
    let lib = root().join("tools/nvrtc/nvidia/cu13/lib");
    if !lib.join("libnvrtc.so.13").exists() {
        assert!(
            std::env::var_os("VRAMLAB_REQUIRE_NVRTC").is_none(),
            "the kernels' test needs NVRTC (scripts/setup installs it)"
        );
        eprintln!("skip: NVRTC is missing");
        return;
    }
    let out = std::env::temp_dir().join(format!("vramlab-kernels-{}", std::process::id()));
    let ran = Command::new(vramlab_bin())
        .arg("kernels")
        .arg("--out")
        .arg(&out)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    for arch in ["sm_75", "sm_80", "sm_89", "sm_90"] {
        assert!(
            said.contains(&format!("{arch}: {} kernels", NAMES.len())),
            "{said}"
        );
        let cubin = std::fs::read(out.join(format!("vramlab-{arch}.cubin"))).unwrap();
        // An ELF image for the GPU, with every kernel's symbol.
        assert_eq!(&cubin[..4], b"\x7fELF", "{arch}");
        for name in NAMES {
            let symbol = format!("\0{name}\0");
            let found = cubin.windows(symbol.len()).any(|w| w == symbol.as_bytes());
            assert!(found, "{arch}: no kernel {name} in the cubin");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A capability written wrongly is refused with the form to use.
#[test]
fn a_wrongly_written_capability_is_refused() {
    let ran = Command::new(vramlab_bin())
        .args(["kernels", "--arch", "sm90"])
        .output()
        .unwrap();
    assert!(!ran.status.success());
    let said = String::from_utf8_lossy(&ran.stderr);
    assert!(said.contains("written like 8.0"), "{said}");
}

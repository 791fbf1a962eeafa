//! The simulator against real PyTorch and JAX: every golden file in
//! tests/golden/ (written on a GPU machine by scripts/gpu-check.sh) must be
//! reproduced exactly by `--device sim`.
//!
//! No golden file from a real GPU exists yet, so the check is ignored (it
//! claims nothing); run it with `cargo test --test golden -- --ignored`
//! once `scripts/gpu-check.sh` has written them. It fails when it checks
//! no number.

use vramlab_shared::{Engine, StepRecord};
use vramlab_tests::root;

const PYTORCH_KEYS: [&str; 8] = [
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "requested_bytes",
    "inactive_split_bytes",
    "segments",
    "num_alloc_retries",
    "num_ooms",
];
const JAX_KEYS: [&str; 2] = ["allocated_bytes", "reserved_bytes"];

#[test]
#[ignore = "no golden files from a real GPU yet: scripts/gpu-check.sh writes them"]
fn the_simulator_reproduces_every_golden_number() {
    let dir = root().join("tests/golden");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    files.sort();
    let mut checked = 0;
    for path in files {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let (name, keys) = if let Some(n) = file.strip_suffix(".pytorch.jsonl") {
            (n.to_string(), &PYTORCH_KEYS[..])
        } else if let Some(n) = file.strip_suffix(".jax.jsonl") {
            (n.to_string(), &JAX_KEYS[..])
        } else {
            continue;
        };
        let commands = std::fs::read_to_string(dir.join(format!("{name}.commands.jsonl")))
            .unwrap_or_else(|e| panic!("{name}.commands.jsonl: {e}"));
        let golden: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let mut engine = Engine::new_simulated();
        let ours: Vec<StepRecord> = commands
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| engine.run_line(l))
            .collect();
        assert_eq!(ours.len(), golden.len(), "{file}: number of steps");
        for (o, g) in ours.iter().zip(&golden) {
            if g["error"]["kind"] == "unsupported" {
                continue;
            }
            for key in keys {
                assert_eq!(
                    o.stats.get(key),
                    g["stats"][key].as_u64(),
                    "{file} step {}: {key} ({})",
                    o.step,
                    g["cmd"]
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked > 0,
        "no golden number was checked: tests/golden/ holds none"
    );
    eprintln!("golden numbers checked: {checked}");
}

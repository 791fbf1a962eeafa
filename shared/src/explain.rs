//! The words around the numbers: which numbers a command moved, what each
//! number is called in the framework at hand, and where to read more.
//! The page and the tests use the same sentences.

use crate::command::Command;
use crate::snapshot::Stats;
use crate::types::Framework;
use crate::units::format_size;
use std::cmp::Ordering;

fn change(label: &str, before: u64, after: u64) -> String {
    match after.cmp(&before) {
        Ordering::Greater => format!("{label} rose by {}", format_size(after - before)),
        Ordering::Less => format!("{label} fell by {}", format_size(before - after)),
        Ordering::Equal => format!("{label} did not move"),
    }
}

/// Which of the three numbers moved, and by how much; then how many
/// tensors are alive when that changed, and the command's own peak when it
/// rose above both what was there before and what is left (what batch
/// size, checkpointing or accumulation change, although allocated after a
/// step may not move).
pub fn moved(before: &Stats, after: &Stats) -> String {
    let mut out = format!(
        "{}; {}; {}.",
        change("Allocated", before.allocated_bytes, after.allocated_bytes),
        change("reserved", before.reserved_bytes, after.reserved_bytes),
        change(
            "nvidia-smi",
            before.device_used_bytes,
            after.device_used_bytes
        ),
    );
    if before.allocations != after.allocations {
        out.push_str(&format!(
            " Live tensors: {} → {}.",
            before.allocations, after.allocations
        ));
    }
    let settled = before.allocated_bytes.max(after.allocated_bytes);
    if after.step_peak_allocated_bytes > settled {
        let was = match before.step_peak_allocated_bytes {
            p if p > before.allocated_bytes => format!(" (the command before: {})", format_size(p)),
            _ => String::new(),
        };
        out.push_str(&format!(
            " Peak during it: {}{was}.",
            format_size(after.step_peak_allocated_bytes)
        ));
    }
    out
}

/// What the framework calls each of the numbers on screen. The peak on
/// screen is the last command's own: the framework's peak call counts
/// from its last reset, so its caption says the reset it stands for
/// (`reset_peak_memory_stats()` just before the command).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Captions {
    pub allocated: &'static str,
    pub reserved: &'static str,
    pub peak: &'static str,
}

pub fn captions(framework: Framework) -> Captions {
    match framework {
        Framework::Pytorch => Captions {
            allocated: "torch.cuda.memory_allocated()",
            reserved: "torch.cuda.memory_reserved()",
            peak: "max_memory_allocated() after a reset",
        },
        Framework::Tensorflow => Captions {
            allocated: "tf.config.experimental.get_memory_info('GPU:0')['current']",
            reserved: "the BFC pool (TensorFlow has no call for it)",
            peak: "get_memory_info()['peak'] after a reset",
        },
        Framework::Jax => Captions {
            allocated: "jax.devices()[0].memory_stats()['bytes_in_use']",
            reserved: "memory_stats()['pool_bytes']",
            peak: "its own (peak_bytes_in_use is since start)",
        },
    }
}

/// Where to read more about what a command does, in the framework at hand.
pub fn fact_link(cmd: &Command, framework: Framework) -> (&'static str, &'static str) {
    const PYTHON_GC: (&str, &str) = (
        "Python: the del statement and gc",
        "https://docs.python.org/3/library/gc.html",
    );
    match (cmd, framework) {
        (Command::Del { .. } | Command::Hold { .. } | Command::Assign { .. }, _)
        | (Command::Append { .. } | Command::Gc {}, _) => PYTHON_GC,
        (Command::ClearSession {}, _) => (
            "Keras: clear_session",
            "https://keras.io/api/utils/config_utils/#clearsession-function",
        ),
        (_, Framework::Tensorflow) => (
            "TensorFlow: use a GPU (memory growth and limits)",
            "https://www.tensorflow.org/guide/gpu#limiting_gpu_memory_growth",
        ),
        (_, Framework::Jax) => (
            "JAX: GPU memory allocation",
            "https://jax.readthedocs.io/en/latest/gpu_memory_allocation.html",
        ),
        (
            Command::EmptyCache {}
            | Command::ClearCublasWorkspaces {}
            | Command::Alloc { .. }
            | Command::Restart(_)
            | Command::ResetPeakMemoryStats {},
            Framework::Pytorch,
        ) => (
            "PyTorch: CUDA memory management",
            "https://pytorch.org/docs/stable/notes/cuda.html#memory-management",
        ),
        (_, Framework::Pytorch) => (
            "PyTorch FAQ: out of memory",
            "https://pytorch.org/docs/stable/notes/faq.html",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{KIB, MIB};

    fn stats(allocated: u64, allocations: u64, peak: u64) -> Stats {
        Stats {
            allocated_bytes: allocated,
            reserved_bytes: 64 * MIB,
            device_used_bytes: 364 * MIB,
            allocations,
            step_peak_allocated_bytes: peak,
            ..Stats::default()
        }
    }

    #[test]
    fn moved_names_the_three_numbers() {
        assert_eq!(
            moved(&stats(64 * MIB, 1, 64 * MIB), &stats(0, 1, 64 * MIB)),
            "Allocated fell by 64.00 MiB; reserved did not move; nvidia-smi did not move."
        );
    }

    #[test]
    fn moved_counts_live_tensors_and_compares_peaks() {
        let before = stats(16 * MIB, 10, 40 * MIB);
        let after = stats(16 * MIB + 100 * KIB, 210, 30 * MIB);
        assert_eq!(
            moved(&before, &after),
            "Allocated rose by 100.00 KiB; reserved did not move; nvidia-smi did not move. \
             Live tensors: 10 → 210. Peak during it: 30.00 MiB (the command before: 40.00 MiB)."
        );
        // A command with no transient memory says nothing of a peak.
        let plain = stats(16 * MIB, 10, 16 * MIB);
        assert_eq!(
            moved(&plain, &plain),
            "Allocated did not move; reserved did not move; nvidia-smi did not move."
        );
    }

    #[test]
    fn captions_and_links_follow_the_framework() {
        assert_eq!(
            captions(Framework::Pytorch).allocated,
            "torch.cuda.memory_allocated()"
        );
        assert!(captions(Framework::Jax).allocated.contains("bytes_in_use"));
        // The peak tile is the command's own: each caption says so.
        assert_eq!(
            captions(Framework::Pytorch).peak,
            "max_memory_allocated() after a reset"
        );
        assert!(captions(Framework::Jax).peak.starts_with("its own"));
        assert!(captions(Framework::Tensorflow)
            .allocated
            .contains("get_memory_info"));
        let alloc: Command = crate::command::parse_line(r#"{"cmd":"alloc","name":"x","bytes":1}"#)
            .command
            .unwrap();
        assert!(fact_link(&alloc, Framework::Pytorch)
            .1
            .contains("pytorch.org"));
        assert!(fact_link(&alloc, Framework::Tensorflow)
            .1
            .contains("tensorflow.org"));
        assert!(fact_link(&alloc, Framework::Jax)
            .1
            .contains("jax.readthedocs.io"));
        assert!(fact_link(&Command::Gc {}, Framework::Jax)
            .1
            .contains("python.org"));
    }
}

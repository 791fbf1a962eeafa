//! The popular advice on freeing GPU memory, as code that runs in the cell,
//! and the claims it makes, judged on the numbers the run produced.

use crate::stats::Stats;
use crate::types::Framework;
use crate::units::format_size;

/// One piece of advice: the code people are told to run, and its claims.
pub struct Advice {
    pub id: &'static str,
    pub title: &'static str,
    pub framework: Framework,
    pub claims: &'static [Claim],
}

impl Advice {
    /// The code, as the cell runs it. The page fetches the same file
    /// (`advice/{id}.py`) when the advice is picked, so the code is no
    /// part of the page's first load.
    pub fn source(&self) -> &'static str {
        match self.id {
            "keras-clear-session" => include_str!("advice/keras-clear-session.py"),
            "keras-del-gc-clear" => include_str!("advice/keras-del-gc-clear.py"),
            "torch-del-empty-cache" => include_str!("advice/torch-del-empty-cache.py"),
            "tf1-session-close" => include_str!("advice/tf1-session-close.py"),
            "torch-batches-not-dataset" => include_str!("advice/torch-batches-not-dataset.py"),
            "torch-accumulate" => include_str!("advice/torch-accumulate.py"),
            "torch-watch-allocated" => include_str!("advice/torch-watch-allocated.py"),
            _ => "",
        }
    }
}

/// Which number a claim is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Number {
    Allocated,
    Reserved,
    NvidiaSmi,
    /// The peak of allocated during the statement.
    StepPeak,
}

impl Number {
    pub fn read(self, s: &Stats) -> u64 {
        match self {
            Number::Allocated => s.allocated_bytes,
            Number::Reserved => s.reserved_bytes,
            Number::NvidiaSmi => s.device_used_bytes,
            Number::StepPeak => s.step_peak_allocated_bytes,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Number::Allocated => "allocated",
            Number::Reserved => "reserved",
            Number::NvidiaSmi => "nvidia-smi",
            Number::StepPeak => "the step's peak",
        }
    }
}

/// What a claim says happens; statements are named by a piece of their source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Says {
    /// The number falls while the statement runs.
    Falls(Number, &'static str),
    /// The number is lower after the second statement than after the first.
    Lower(Number, &'static str, &'static str),
    /// After the statement the number is back where it was before the first.
    BackTo(Number, &'static str, &'static str),
    /// The number does not rise while the statement runs.
    NoRise(Number, &'static str),
    /// After the statement, allocated is as high as it was at the statement's peak.
    PeakStays(&'static str),
}

pub struct Claim {
    pub text: &'static str,
    pub says: Says,
}

/// The numbers around each statement of a run: before and after.
pub trait Run {
    /// Before and after the first statement whose source contains `at`.
    fn around(&self, at: &str) -> Option<(Stats, Stats)>;
}

/// A claim judged: whether it held, and the numbers that decide it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub held: bool,
    pub because: String,
}

impl Claim {
    /// `None` when the run did not reach the statements the claim is about.
    pub fn judge(&self, run: &dyn Run) -> Option<Verdict> {
        let size = format_size;
        Some(match self.says {
            Says::Falls(n, at) => {
                let (b, a) = run.around(at)?;
                let (b, a) = (n.read(&b), n.read(&a));
                verdict(
                    a < b,
                    format!(
                        "{} went from {} to {} at `{at}`",
                        n.label(),
                        size(b),
                        size(a)
                    ),
                )
            }
            Says::NoRise(n, at) => {
                let (b, a) = run.around(at)?;
                let (b, a) = (n.read(&b), n.read(&a));
                verdict(
                    a <= b,
                    format!(
                        "{} went from {} to {} at `{at}`",
                        n.label(),
                        size(b),
                        size(a)
                    ),
                )
            }
            Says::PeakStays(at) => {
                let a = run.around(at)?.1;
                let (peak, now) = (a.step_peak_allocated_bytes, a.allocated_bytes);
                verdict(
                    now >= peak,
                    format!(
                        "the step peaked at {} and left {} allocated",
                        size(peak),
                        size(now)
                    ),
                )
            }
            Says::Lower(n, first, second) => {
                let x = n.read(&run.around(first)?.1);
                let y = n.read(&run.around(second)?.1);
                verdict(
                    y < x,
                    format!(
                        "{} was {} at `{first}` and {} at `{second}`",
                        n.label(),
                        size(x),
                        size(y)
                    ),
                )
            }
            Says::BackTo(n, start, end) => {
                let x = n.read(&run.around(start)?.0);
                let y = n.read(&run.around(end)?.1);
                verdict(
                    y == x,
                    format!(
                        "{} was {} before `{start}` and {} after `{end}`",
                        n.label(),
                        size(x),
                        size(y)
                    ),
                )
            }
        })
    }
}

fn verdict(held: bool, because: String) -> Verdict {
    Verdict { held, because }
}

/// The advice, in the order the page lists it.
pub const ADVICE: &[Advice] = &[
    Advice {
        id: "keras-clear-session",
        title: "Keras: call clear_session() after fit",
        framework: Framework::Tensorflow,
        claims: &[
            Claim {
                text: "clear_session() frees the model's GPU memory",
                says: Says::Falls(Number::Allocated, "clear_session()"),
            },
            Claim {
                text: "nvidia-smi shows the memory given back",
                says: Says::Falls(Number::NvidiaSmi, "clear_session()"),
            },
        ],
    },
    Advice {
        id: "keras-del-gc-clear",
        title: "Keras: del model, gc.collect(), clear_session()",
        framework: Framework::Tensorflow,
        claims: &[
            Claim {
                text: "the three together free the model's memory",
                says: Says::BackTo(Number::Allocated, "model = ", "clear_session()"),
            },
            Claim {
                text: "nvidia-smi goes back to where it was",
                says: Says::BackTo(Number::NvidiaSmi, "model = ", "clear_session()"),
            },
        ],
    },
    Advice {
        id: "torch-del-empty-cache",
        title: "PyTorch: del model and optimizer, then empty_cache()",
        framework: Framework::Pytorch,
        claims: &[
            Claim {
                text: "del frees the model's memory",
                says: Says::Falls(Number::Allocated, "del model"),
            },
            Claim {
                text: "del gives the memory back to nvidia-smi",
                says: Says::Falls(Number::NvidiaSmi, "del model"),
            },
            Claim {
                text: "empty_cache() gives it back to nvidia-smi",
                says: Says::Falls(Number::NvidiaSmi, "empty_cache()"),
            },
            Claim {
                text: "afterwards memory is back to where it started",
                says: Says::BackTo(Number::Allocated, "model = ", "empty_cache()"),
            },
        ],
    },
    Advice {
        id: "tf1-session-close",
        title: "TF1: close the session and open a new one",
        framework: Framework::Tensorflow,
        claims: &[
            Claim {
                text: "closing the session frees its variables",
                says: Says::Falls(Number::Allocated, "sess.close()"),
            },
            Claim {
                text: "nvidia-smi shows the memory given back",
                says: Says::Falls(Number::NvidiaSmi, "sess.close()"),
            },
        ],
    },
    Advice {
        id: "torch-batches-not-dataset",
        title: "Feed batches instead of putting the dataset on the GPU",
        framework: Framework::Pytorch,
        claims: &[
            Claim {
                text: "a DataLoader over host tensors takes no GPU memory until a batch moves",
                says: Says::NoRise(Number::Allocated, "loader = "),
            },
            Claim {
                text: "training from host batches peaks lower than from the dataset on the GPU",
                says: Says::Lower(
                    Number::StepPeak,
                    "zip(range(20), on_gpu)",
                    "zip(range(20), loader)",
                ),
            },
        ],
    },
    Advice {
        id: "torch-accumulate",
        title: "Gradient accumulation instead of a bigger batch",
        framework: Framework::Pytorch,
        claims: &[Claim {
            text: "4 micro-batches of 512 peak lower than one batch of 2048",
            says: Says::Lower(
                Number::StepPeak,
                "zip(range(5), big)",
                "zip(range(20), small)",
            ),
        }],
    },
    Advice {
        id: "torch-watch-allocated",
        title: "Watch memory_allocated() to pick the batch size",
        framework: Framework::Pytorch,
        claims: &[Claim {
            text: "memory_allocated() after a step shows what the step needs",
            says: Says::PeakStays("zip(range(3), loader)"),
        }],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Each claim is judged around code its example has (the page finds the
    /// statement holding it; `tests/cell.rs` runs every example in the page).
    #[test]
    fn every_claim_names_code_its_example_has() {
        for a in ADVICE {
            for c in a.claims {
                let ats: Vec<&str> = match c.says {
                    Says::Falls(_, at) | Says::NoRise(_, at) | Says::PeakStays(at) => vec![at],
                    Says::Lower(_, x, y) | Says::BackTo(_, x, y) => vec![x, y],
                };
                for at in ats {
                    assert!(a.source().contains(at), "{}: no code has {at:?}", a.id);
                }
            }
        }
    }

    /// Every piece of advice has its code file, and every file is one's
    /// (the page fetches `advice/ID.py` by id).
    #[test]
    fn every_advice_has_its_code_file() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/advice");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut ids: Vec<String> = ADVICE.iter().map(|a| format!("{}.py", a.id)).collect();
        ids.sort();
        assert_eq!(files, ids);
        for a in ADVICE {
            let file = std::fs::read_to_string(format!("{dir}/{}.py", a.id)).unwrap();
            assert_eq!(a.source(), file, "{}", a.id);
        }
    }
}

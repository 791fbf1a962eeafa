//! The prediction a lesson step asks for before it runs: which way one of
//! the three numbers will go. The number asked about is the one that
//! teaches: one the step leaves still while another moves (the surprise
//! of `del` or `clear_session`), else the first that moves.

use crate::snapshot::Stats;
use serde_json::Value;
use std::collections::BTreeMap;

/// One of the three numbers on screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Number {
    Allocated,
    Reserved,
    NvidiaSmi,
}

impl Number {
    const ALL: [Number; 3] = [Number::Allocated, Number::Reserved, Number::NvidiaSmi];

    /// The key a lesson's `expect` uses for it.
    pub fn key(self) -> &'static str {
        match self {
            Number::Allocated => "allocated_bytes",
            Number::Reserved => "reserved_bytes",
            Number::NvidiaSmi => "device_used_bytes",
        }
    }

    /// Its name on screen.
    pub fn label(self) -> &'static str {
        match self {
            Number::Allocated => "allocated",
            Number::Reserved => "reserved",
            Number::NvidiaSmi => "nvidia-smi",
        }
    }

    pub fn of(self, s: &Stats) -> u64 {
        match self {
            Number::Allocated => s.allocated_bytes,
            Number::Reserved => s.reserved_bytes,
            Number::NvidiaSmi => s.device_used_bytes,
        }
    }
}

/// Which way a number goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Rises,
    Falls,
    Stays,
}

impl Direction {
    pub const ALL: [Direction; 3] = [Direction::Rises, Direction::Falls, Direction::Stays];

    pub fn between(before: u64, after: u64) -> Self {
        match after.cmp(&before) {
            std::cmp::Ordering::Greater => Direction::Rises,
            std::cmp::Ordering::Less => Direction::Falls,
            std::cmp::Ordering::Equal => Direction::Stays,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Direction::Rises => "rises",
            Direction::Falls => "falls",
            Direction::Stays => "stays",
        }
    }
}

/// The number to predict for a step expected to leave `expect` after
/// `before`; none when the step names none of the three.
pub fn number_to_predict(expect: &BTreeMap<String, Value>, before: &Stats) -> Option<Number> {
    let expected: Vec<(Number, Direction)> = Number::ALL
        .into_iter()
        .filter_map(|n| {
            let want = expect.get(n.key())?.as_u64()?;
            Some((n, Direction::between(n.of(before), want)))
        })
        .collect();
    let still = expected.iter().find(|(_, d)| *d == Direction::Stays);
    let moving = expected.iter().find(|(_, d)| *d != Direction::Stays);
    match (still, moving) {
        (Some(&(n, _)), Some(_)) => Some(n),
        (_, Some(&(n, _))) => Some(n),
        (still, None) => still.map(|&(n, _)| n),
    }
}

/// What the learner is told after the step: their guess against the run.
pub fn verdict(number: Number, guess: Direction, before: &Stats, after: &Stats) -> (bool, String) {
    let actual = Direction::between(number.of(before), number.of(after));
    let right = actual == guess;
    let text = format!(
        "You said {} {}; it {}. {}",
        number.label(),
        guess.word(),
        if actual == Direction::Stays {
            "stayed".to_string()
        } else {
            format!(
                "{} by {}",
                if actual == Direction::Rises {
                    "rose"
                } else {
                    "fell"
                },
                crate::units::format_size(number.of(before).abs_diff(number.of(after)))
            )
        },
        if right {
            "Right."
        } else {
            "Not what you expected: read why below."
        }
    );
    (right, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect(pairs: &[(&str, u64)]) -> BTreeMap<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect()
    }

    fn stats(allocated: u64, reserved: u64, device: u64) -> Stats {
        Stats {
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            device_used_bytes: device,
            ..Stats::default()
        }
    }

    #[test]
    fn del_asks_about_the_number_that_stays() {
        // Lesson 1, `del x`: allocated falls, reserved and nvidia-smi stay.
        let before = stats(268_435_968, 270_532_608, 585_105_408);
        let step = expect(&[
            ("allocated_bytes", 512),
            ("reserved_bytes", 270_532_608),
            ("device_used_bytes", 585_105_408),
        ]);
        assert_eq!(number_to_predict(&step, &before), Some(Number::Reserved));
    }

    #[test]
    fn otherwise_the_first_number_that_moves_or_none() {
        let before = stats(0, 0, 314_572_800);
        let alloc = expect(&[("allocated_bytes", 1024), ("reserved_bytes", 2_097_152)]);
        assert_eq!(number_to_predict(&alloc, &before), Some(Number::Allocated));
        let nothing = expect(&[("allocated_bytes", 0)]);
        assert_eq!(
            number_to_predict(&nothing, &before),
            Some(Number::Allocated)
        );
        assert_eq!(
            number_to_predict(&expect(&[("segments", 1)]), &before),
            None
        );
    }

    #[test]
    fn the_verdict_compares_the_guess_with_the_run() {
        let (before, after) = (stats(512, 4096, 9000), stats(0, 4096, 9000));
        assert_eq!(
            verdict(Number::Reserved, Direction::Falls, &before, &after),
            (
                false,
                "You said reserved falls; it stayed. Not what you expected: read why below.".into()
            )
        );
        assert_eq!(
            verdict(Number::Allocated, Direction::Falls, &before, &after),
            (
                true,
                "You said allocated falls; it fell by 512 bytes. Right.".into()
            )
        );
    }
}

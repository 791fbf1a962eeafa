//! `roundup_power2_divisions` (`PYTORCH_CUDA_ALLOC_CONF`): how many equal
//! steps `round_size` cuts each power-of-two interval into, one value per
//! size interval from 1 MiB to 64 GiB (`AllocatorConfig::
//! roundup_power2_divisions`, `parseRoundUpPower2Divisions` in
//! `c10/core/AllocatorConfig.cpp`).
//!
//! Written as one number for every size (`8`) or as a list of
//! `interval_mb:divisions` entries (`[256:1,512:2,>:8]`). The list follows
//! the parser, not the documentation: the first entry also fills every
//! interval below it, and `>` fills from the last named interval on,
//! that interval included (so in `[256:1,512:2,>:8]` sizes from 512 MiB
//! get 8, not 2).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use vramlab_core::error::Invalid;

/// `kRoundUpPowerOfTwoIntervals`: 1 MiB, 2 MiB, … 32 GiB and above.
pub const INTERVALS: usize = 16;
/// log2 of `kRoundUpPowerOfTwoStart` (1 MiB).
const FIRST_INTERVAL_LOG2: u32 = 20;

/// Divisions per size interval; 0 or 1: plain 512-byte rounding. Each is
/// 0 or a power of two, kept as its log2 plus one (0 for 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundupDivisions([u8; INTERVALS]);

impl RoundupDivisions {
    /// The same number of divisions for every size (0: off).
    pub fn uniform(divisions: u64) -> Result<Self, Invalid> {
        Ok(Self([encode(divisions)?; INTERVALS]))
    }

    /// One value per interval, from 1 MiB up (as a snapshot's
    /// `allocator_settings` lists them).
    pub fn from_table(table: [u64; INTERVALS]) -> Result<Self, Invalid> {
        let mut out = [0; INTERVALS];
        for (o, d) in out.iter_mut().zip(table) {
            *o = encode(d)?;
        }
        Ok(Self(out))
    }

    /// `roundup_power2_divisions(size)`: the divisions for a size's
    /// interval (sizes under 2 MiB share the first, 32 GiB and up the last).
    pub fn for_size(&self, size: u64) -> u64 {
        let log2 = 63 - size.max(1).leading_zeros();
        let index = log2.saturating_sub(FIRST_INTERVAL_LOG2) as usize;
        decode(self.0[index.min(INTERVALS - 1)])
    }

    /// Off for every size.
    pub fn is_off(&self) -> bool {
        self.0.iter().all(|&d| decode(d) <= 1)
    }

    /// The value for each interval, from 1 MiB up.
    pub fn per_interval(&self) -> [u64; INTERVALS] {
        self.0.map(decode)
    }

    fn is_uniform(&self) -> bool {
        self.0.iter().all(|&d| d == self.0[0])
    }

    /// Reads the value as `PYTORCH_CUDA_ALLOC_CONF` writes it: `8` or
    /// `[256:1,512:2,>:8]`.
    pub fn parse(text: &str) -> Result<Self, Invalid> {
        let text: String = text.chars().filter(|c| *c != ' ').collect();
        let Some(list) = text.strip_prefix('[') else {
            let value = parse_number(&text)?;
            if !value.is_power_of_two() {
                return Err("For roundups, the divisions has to be power of 2".into());
            }
            return Self::uniform(value);
        };
        let list = list
            .strip_suffix(']')
            .ok_or("roundup_power2_divisions: a list ends with ']'")?;
        let mut table = [0; INTERVALS];
        let (mut last_index, mut first) = (0, true);
        for entry in list.split(',').filter(|e| !e.is_empty()) {
            let (interval, divisions) = entry.split_once(':').ok_or_else(|| {
                Invalid(format!(
                    "roundup_power2_divisions: '{entry}' is not interval_mb:divisions"
                ))
            })?;
            let divisions = parse_number(divisions)?;
            if interval == ">" {
                table[last_index..].fill(divisions);
                continue;
            }
            let mb = parse_number(interval)?;
            if !mb.is_power_of_two() {
                return Err("For roundups, the intervals have to be power of 2".into());
            }
            let index = (mb.ilog2() as usize).min(INTERVALS - 1);
            if first {
                table[..index].fill(divisions);
                first = false;
            }
            table[index] = divisions;
            last_index = index;
        }
        Self::from_table(table)
    }
}

/// 0 or a power of two, as its log2 plus one.
fn encode(divisions: u64) -> Result<u8, Invalid> {
    check_divisions(divisions)?;
    Ok(match divisions {
        0 => 0,
        d => d.ilog2() as u8 + 1,
    })
}

fn decode(code: u8) -> u64 {
    match code {
        0 => 0,
        c => 1 << (c - 1),
    }
}

fn parse_number(text: &str) -> Result<u64, Invalid> {
    text.parse().map_err(|_| {
        Invalid(format!(
            "roundup_power2_divisions: '{text}' is not a whole number"
        ))
    })
}

fn check_divisions(divisions: u64) -> Result<(), Invalid> {
    if divisions == 0 || divisions.is_power_of_two() {
        Ok(())
    } else {
        Err(Invalid(format!(
            "For roundups, the divisions has to be power of 2 or 0 to disable roundup (got {divisions})"
        )))
    }
}

/// One number when every interval has the same value, else the full list
/// (`[1:0,2:0,…,32768:8]`), which reads back as itself.
impl fmt::Display for RoundupDivisions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.per_interval();
        if self.is_uniform() {
            return write!(f, "{}", table[0]);
        }
        let entries: Vec<String> = (0..INTERVALS)
            .map(|i| format!("{}:{}", 1u64 << i, table[i]))
            .collect();
        write!(f, "[{}]", entries.join(","))
    }
}

impl Serialize for RoundupDivisions {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.is_uniform() {
            true => serializer.serialize_u64(decode(self.0[0])),
            false => serializer.collect_str(self),
        }
    }
}

/// A number (`8`) or the `PYTORCH_CUDA_ALLOC_CONF` text (`"[256:1,>:8]"`).
impl<'de> Deserialize<'de> for RoundupDivisions {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        let parsed = match (value.as_u64(), value.as_str()) {
            (Some(n), _) => Self::uniform(n),
            (_, Some(text)) => Self::parse(text),
            _ => Err(
                "roundup_power2_divisions is a number like 8 or a list like \"[256:1,512:2,>:8]\""
                    .into(),
            ),
        };
        parsed.map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramlab_core::units::{GIB, MIB};

    /// The documentation's example, read as `parseRoundUpPower2Divisions`
    /// reads it: `>` overwrites the last named interval (1 GiB).
    #[test]
    fn a_list_fills_below_its_first_entry_and_from_its_last_on() {
        let r = RoundupDivisions::parse("[256:1,512:2,1024:4,>:8]").unwrap();
        let mut want = [1; INTERVALS];
        want[9] = 2;
        want[10..].fill(8);
        assert_eq!(r.per_interval(), want);
        assert_eq!(r.for_size(100), 1);
        assert_eq!(r.for_size(300 * MIB), 1);
        assert_eq!(r.for_size(600 * MIB), 2);
        assert_eq!(r.for_size(GIB), 8);
        assert_eq!(r.for_size(100 * GIB), 8);
    }

    #[test]
    fn one_number_is_every_interval_and_texts_read_back() {
        let r = RoundupDivisions::parse("4").unwrap();
        assert_eq!(r, RoundupDivisions::uniform(4).unwrap());
        assert_eq!(r.to_string(), "4");
        let list = RoundupDivisions::parse("[64:2, >:8]").unwrap();
        assert_eq!(RoundupDivisions::parse(&list.to_string()).unwrap(), list);
        let json = serde_json::to_string(&list).unwrap();
        assert_eq!(
            serde_json::from_str::<RoundupDivisions>(&json).unwrap(),
            list
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), "4");
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        let err = |t: &str| RoundupDivisions::parse(t).unwrap_err().0;
        assert!(err("3").contains("power of 2"));
        assert!(err("0").contains("power of 2"));
        assert!(err("[300:2]").contains("intervals have to be power of 2"));
        assert!(err("[256:3]").contains("(got 3)"));
        assert!(err("[256:2").contains("ends with ']'"));
        assert!(err("[256]").contains("interval_mb:divisions"));
        assert!(err("eight").contains("not a whole number"));
        assert!(serde_json::from_str::<RoundupDivisions>("6").is_err());
        assert!(serde_json::from_str::<RoundupDivisions>("true").is_err());
    }
}

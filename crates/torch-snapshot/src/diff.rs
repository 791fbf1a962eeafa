//! Two recordings side by side (`vramlab diff A B`): each one's peak of
//! allocated memory in its exact replay, the live blocks there grouped by
//! the frame that allocated them, and the frames that make the difference
//! between the two peaks, ranked until they explain at least 90% of it.

use super::format::MemorySnapshot;
use super::replay::{replay_exact, segments_at, thin, TimelinePoint};
use super::SnapshotError;
use serde::{Deserialize, Serialize};
use vramlab_core::units::format_size;
use vramlab_device::alloc::BlockState;

/// The share of the peak difference the ranked frames explain.
const EXPLAINED: f64 = 0.9;

/// One recording's peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    pub events: usize,
    /// The event after which allocated memory peaked, and how much.
    pub event: usize,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// Live bytes there by the frame that allocated them, most first.
    pub frames: Vec<(String, u64)>,
    /// Allocated and reserved after each event, thinned for a chart.
    pub timeline: Vec<TimelinePoint>,
}

/// A frame's bytes at each peak.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameDelta {
    pub frame: String,
    pub a_bytes: u64,
    pub b_bytes: u64,
}

impl FrameDelta {
    pub fn delta(&self) -> i64 {
        self.b_bytes as i64 - self.a_bytes as i64
    }
}

/// The comparison.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diff {
    pub a: Peak,
    pub b: Peak,
    /// The frames that explain the peak difference, the largest share
    /// first, until they explain at least 90% of it (all that move it, if
    /// fewer do).
    pub explaining: Vec<FrameDelta>,
    /// Every frame whose bytes differ between the peaks, largest first.
    pub all: Vec<FrameDelta>,
}

impl Diff {
    /// B's peak less A's.
    pub fn peak_delta(&self) -> i64 {
        self.b.allocated_bytes as i64 - self.a.allocated_bytes as i64
    }

    /// The share of the peak difference the explaining frames make.
    pub fn explained(&self) -> f64 {
        let total = self.peak_delta();
        if total == 0 {
            return 1.0;
        }
        self.explaining.iter().map(|f| f.delta()).sum::<i64>() as f64 / total as f64
    }
}

/// Compares `device`'s trace of each recording.
pub fn diff(
    a: (&MemorySnapshot, usize),
    b: (&MemorySnapshot, usize),
) -> Result<Diff, SnapshotError> {
    let (a, b) = (peak(a.0, a.1)?, peak(b.0, b.1)?);
    let mut all: Vec<FrameDelta> = Vec::new();
    for (frame, bytes) in &a.frames {
        all.push(FrameDelta {
            frame: frame.clone(),
            a_bytes: *bytes,
            b_bytes: 0,
        });
    }
    for (frame, bytes) in &b.frames {
        match all.iter_mut().find(|f| f.frame == *frame) {
            Some(f) => f.b_bytes = *bytes,
            None => all.push(FrameDelta {
                frame: frame.clone(),
                a_bytes: 0,
                b_bytes: *bytes,
            }),
        }
    }
    all.retain(|f| f.delta() != 0);
    all.sort_by(|x, y| {
        (y.delta().unsigned_abs().cmp(&x.delta().unsigned_abs()))
            .then_with(|| x.frame.cmp(&y.frame))
    });
    let total = b.allocated_bytes as i64 - a.allocated_bytes as i64;
    // The frames that move the peak the way it moved, largest first.
    let goal = EXPLAINED * total.unsigned_abs() as f64;
    let (mut explaining, mut sum) = (Vec::new(), 0u64);
    for f in all
        .iter()
        .filter(|f| total != 0 && f.delta().signum() == total.signum())
    {
        if sum as f64 >= goal {
            break;
        }
        sum += f.delta().unsigned_abs();
        explaining.push(f.clone());
    }
    Ok(Diff {
        a,
        b,
        explaining,
        all,
    })
}

/// A recording's peak of allocated memory in its exact replay.
fn peak(snapshot: &MemorySnapshot, device: usize) -> Result<Peak, SnapshotError> {
    let run = replay_exact(snapshot, device)?;
    let at = (run.timeline.iter())
        .max_by_key(|p| (p.allocated_bytes, std::cmp::Reverse(p.event)))
        .copied()
        .unwrap_or(TimelinePoint {
            event: 0,
            allocated_bytes: 0,
            reserved_bytes: 0,
        });
    let frames = live_by_frame(snapshot, device, at.event)?;
    Ok(Peak {
        events: run.events,
        event: at.event,
        allocated_bytes: at.allocated_bytes,
        reserved_bytes: at.reserved_bytes,
        frames,
        timeline: thin(&run.timeline),
    })
}

/// The live blocks after `event` in the exact replay, their bytes summed
/// by the frame that allocated them (not by the event), most first.
pub(super) fn live_by_frame(
    snapshot: &MemorySnapshot,
    device: usize,
    event: usize,
) -> Result<Vec<(String, u64)>, SnapshotError> {
    let mut frames: Vec<(String, u64)> = Vec::new();
    for segment in segments_at(snapshot, device, None, event)? {
        for block in segment.blocks {
            if block.state != BlockState::ActiveAllocated {
                continue;
            }
            let owner = block
                .owner
                .unwrap_or_else(|| "(live when the recording started)".into());
            let frame = match owner.rfind(" (event ") {
                Some(cut) => owner[..cut].to_string(),
                None => owner,
            };
            match frames.iter_mut().find(|(f, _)| *f == frame) {
                Some((_, bytes)) => *bytes += block.size,
                None => frames.push((frame, block.size)),
            }
        }
    }
    frames.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    Ok(frames)
}

/// What `vramlab diff A B` prints and the snapshot page shows: each
/// peak, the difference and the frames that explain it, and the frames
/// alive at one peak only.
pub fn diff_lines(d: &Diff, a_name: &str, b_name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (name, path, peak) in [("A", a_name, &d.a), ("B", b_name, &d.b)] {
        out.push(format!(
            "{name}: {}: peak allocated {} after event {} of {} (reserved {})",
            path,
            format_size(peak.allocated_bytes),
            peak.event,
            peak.events,
            format_size(peak.reserved_bytes)
        ));
    }
    let delta = d.peak_delta();
    if delta == 0 {
        out.push("the peaks are equal".to_string());
    } else {
        out.push(format!(
            "B's peak is {} {}; {:.0}% of it is in:",
            format_size(delta.unsigned_abs()),
            if delta > 0 { "higher" } else { "lower" },
            100.0 * d.explained()
        ));
        for f in &d.explaining {
            out.push(format!("  {}", line(f)));
        }
    }
    let one_sided: Vec<&FrameDelta> = (d.all.iter())
        .filter(|f| f.a_bytes == 0 || f.b_bytes == 0)
        .collect();
    if !one_sided.is_empty() {
        out.push("alive at one peak only:".to_string());
        for f in one_sided {
            let side = if f.a_bytes == 0 { "B" } else { "A" };
            let bytes = f.a_bytes.max(f.b_bytes);
            out.push(format!(
                "  {side} only: {}  {}",
                format_size(bytes),
                f.frame
            ));
        }
    }
    out
}

/// `+512.00 MiB  frame (A 256.00 MiB, B 768.00 MiB)`.
fn line(f: &FrameDelta) -> String {
    let sign = if f.delta() >= 0 { '+' } else { '-' };
    format!(
        "{sign}{}  {} (A {}, B {})",
        format_size(f.delta().unsigned_abs()),
        f.frame,
        format_size(f.a_bytes),
        format_size(f.b_bytes)
    )
}

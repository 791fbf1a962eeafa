//! Capturing a snapshot from a process: every segment with its blocks named
//! by their owners, every live object with what keeps it alive.

use super::{BlockSnapshot, ObjectSnapshot, SegmentSnapshot, Snapshot};
use crate::process::Process;
use crate::runtime::ObjectKind;
use std::collections::HashMap;
use vramlab_core::types::{Category, Framework};
use vramlab_device::alloc::{BlockId, SegmentView};
use vramlab_device::device::DeviceInfo;

/// Everything the views draw, with the last `max_events` events.
pub fn capture(
    process: &Process,
    step: u64,
    framework: Framework,
    device: DeviceInfo,
    max_events: usize,
) -> Snapshot {
    let owners = process.owners();
    let segments = process
        .allocator
        .segments()
        .into_iter()
        .map(|s| segment(s, &owners))
        .collect();
    let events = process.events();
    let skip = events.len().saturating_sub(max_events);
    Snapshot {
        step,
        framework,
        device,
        stats: process.stats(),
        segments,
        objects: objects(process),
        events: events.iter().skip(skip).cloned().collect(),
    }
}

fn segment(s: SegmentView, owners: &HashMap<BlockId, (&str, Category)>) -> SegmentSnapshot {
    let mut allocated_size = 0;
    let mut requested_size = 0;
    let blocks = s
        .blocks
        .into_iter()
        .map(|b| {
            let owner = b.id.and_then(|id| owners.get(&id));
            if b.id.is_some() {
                allocated_size += b.size;
                requested_size += b.requested_size;
            }
            BlockSnapshot {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                state: b.state,
                owner: owner.map(|(n, _)| n.to_string()),
                category: owner.map(|(_, c)| *c),
            }
        })
        .collect();
    SegmentSnapshot {
        address: s.address,
        total_size: s.total_size,
        allocated_size,
        requested_size,
        pool: s.pool.name().to_string(),
        blocks,
    }
}

fn objects(process: &Process) -> Vec<ObjectSnapshot> {
    let names = process.runtime.names_of();
    let why = process.runtime.retention();
    process
        .runtime
        .objects()
        .iter()
        .zip(names.into_iter().zip(why))
        .map(|((&id, o), (names, kept_alive_by))| {
            let (category, requested_bytes) = match &o.kind {
                ObjectKind::Tensor(t) => (Some(t.category), t.bytes),
                _ => (None, 0),
            };
            ObjectSnapshot {
                id,
                kind: o.kind.type_name().into(),
                label: o.label.clone(),
                names,
                bytes: process.block_size(id),
                requested_bytes,
                refcount: o.refcount,
                category,
                kept_alive_by,
            }
        })
        .collect()
}

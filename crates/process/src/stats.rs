//! What the process counts and logs: the numbers every result carries
//! ([`Stats`]) and the entries of the event log ([`Event`]).

use serde::de::{Deserializer, Error as _};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use vramlab_core::types::Category;
use vramlab_device::alloc::TraceAction;

/// The numbers every result carries, in bytes or counts. For TensorFlow and JAX,
/// allocated is the BFC allocator's `bytes_in_use` and reserved its
/// `pool_bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// `memory_allocated()`.
    pub allocated_bytes: u64,
    /// `memory_reserved()`.
    pub reserved_bytes: u64,
    pub active_bytes: u64,
    pub requested_bytes: u64,
    /// Free bytes inside segments that also hold live blocks: `empty_cache`
    /// cannot return them ("Non-releasable memory").
    pub inactive_split_bytes: u64,
    /// `max_memory_allocated()`.
    pub peak_allocated_bytes: u64,
    /// `max_memory_reserved()`.
    pub peak_reserved_bytes: u64,
    /// nvidia-smi's view of this process: context + every live segment.
    pub device_used_bytes: u64,
    pub device_total_bytes: u64,
    /// `cudaMemGetInfo` free: what any process could still get.
    pub device_free_bytes: u64,
    pub segments: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// Live blocks (`allocation.all.current`).
    pub allocations: u64,
    pub context_bytes: u64,
    pub other_processes_bytes: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// Peak allocated during the command (not lost between samples).
    pub step_peak_allocated_bytes: u64,
    /// Peak reserved during the command.
    pub step_peak_reserved_bytes: u64,
    /// Allocated bytes by what the blocks hold (the memory_viz legend).
    pub categories: BTreeMap<Category, u64>,
}

impl Stats {
    /// The value of a stat by its JSON name, `categories.<name>` for a
    /// category (for lesson expectations).
    pub fn get(&self, key: &str) -> Option<u64> {
        if let Some(name) = key.strip_prefix("categories.") {
            let category = Category::ALL.into_iter().find(|c| c.name() == name)?;
            return Some(self.categories.get(&category).copied().unwrap_or(0));
        }
        let mut stats = self.clone();
        let found = stats.counts().into_iter().find(|(k, _)| *k == key);
        found.map(|(_, v)| *v)
    }

    /// Every count by its JSON name, in the order they are written (all
    /// but `categories`).
    fn counts(&mut self) -> [(&'static str, &mut u64); 20] {
        [
            ("allocated_bytes", &mut self.allocated_bytes),
            ("reserved_bytes", &mut self.reserved_bytes),
            ("active_bytes", &mut self.active_bytes),
            ("requested_bytes", &mut self.requested_bytes),
            ("inactive_split_bytes", &mut self.inactive_split_bytes),
            ("peak_allocated_bytes", &mut self.peak_allocated_bytes),
            ("peak_reserved_bytes", &mut self.peak_reserved_bytes),
            ("device_used_bytes", &mut self.device_used_bytes),
            ("device_total_bytes", &mut self.device_total_bytes),
            ("device_free_bytes", &mut self.device_free_bytes),
            ("segments", &mut self.segments),
            ("num_alloc_retries", &mut self.num_alloc_retries),
            ("num_ooms", &mut self.num_ooms),
            ("allocations", &mut self.allocations),
            ("context_bytes", &mut self.context_bytes),
            ("other_processes_bytes", &mut self.other_processes_bytes),
            ("num_device_alloc", &mut self.num_device_alloc),
            ("num_device_free", &mut self.num_device_free),
            (
                "step_peak_allocated_bytes",
                &mut self.step_peak_allocated_bytes,
            ),
            (
                "step_peak_reserved_bytes",
                &mut self.step_peak_reserved_bytes,
            ),
        ]
    }
}

/// Read by hand, through the names [`Stats::counts`] gives: every result,
/// delta and snapshot carries the stats, and serde's derived reader for
/// twenty fields is a large part of the page's download. As with the
/// derived one, every field must be there and others are ignored.
impl<'de> Deserialize<'de> for Stats {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut fields = serde_json::Map::<String, Value>::deserialize(d)?;
        let mut stats = Stats::default();
        for (key, slot) in stats.counts() {
            let value = fields
                .remove(key)
                .ok_or_else(|| D::Error::missing_field(key))?;
            *slot = value.as_u64().ok_or_else(|| {
                D::Error::custom(format!(
                    "{key}: expected a count of bytes or blocks, got {value}"
                ))
            })?;
        }
        let categories = fields
            .remove("categories")
            .ok_or_else(|| D::Error::missing_field("categories"))?;
        stats.categories = BTreeMap::deserialize(categories).map_err(D::Error::custom)?;
        Ok(stats)
    }
}

/// One entry of the event log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Position in the whole log since the server started the session.
    pub seq: u64,
    /// The command (step) that caused it.
    pub step: u64,
    pub action: EventAction,
    /// Block or segment address; for `oom`, the driver's free bytes.
    pub address: u64,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Read by hand (`fields`): every delta carries events.
impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        vramlab_core::fields::read(d, |f| {
            Ok(Event {
                seq: f.take("seq")?,
                step: f.take("step")?,
                action: f.take("action")?,
                address: f.take("address")?,
                size: f.take("size")?,
                name: f.take("name")?,
            })
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventAction {
    Alloc,
    Free,
    SegmentAlloc,
    SegmentFree,
    Oom,
    /// The process restarted (a notebook's "restart kernel"): it and its context are gone.
    Restart,
}

vramlab_core::read_by_name!(EventAction {
    Alloc = "alloc",
    Free = "free",
    SegmentAlloc = "segment_alloc",
    SegmentFree = "segment_free",
    Oom = "oom",
    Restart = "restart",
});

impl From<TraceAction> for EventAction {
    fn from(a: TraceAction) -> Self {
        match a {
            TraceAction::Alloc => EventAction::Alloc,
            TraceAction::Free => EventAction::Free,
            TraceAction::SegmentAlloc => EventAction::SegmentAlloc,
            TraceAction::SegmentFree => EventAction::SegmentFree,
            TraceAction::Oom => EventAction::Oom,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Stats {
        let mut s = Stats::default();
        for (i, (_, slot)) in s.counts().into_iter().enumerate() {
            *slot = 1000 + i as u64;
        }
        s.categories.insert(Category::Activation, 512);
        s
    }

    #[test]
    fn stats_read_back_as_written() {
        let s = sample();
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Stats>(&text).unwrap(), s);
        let value = serde_json::to_value(&s).unwrap();
        assert_eq!(Stats::deserialize(value).unwrap(), s);
    }

    #[test]
    fn every_count_has_its_own_name() {
        let s = sample();
        assert_eq!(s.get("allocated_bytes"), Some(1000));
        assert_eq!(s.get("step_peak_reserved_bytes"), Some(1019));
        assert_eq!(s.get("categories.activation"), Some(512));
        assert_eq!(s.get("categories.parameter"), Some(0));
        assert_eq!(s.get("allocated"), None);
        let value = serde_json::to_value(&s).unwrap();
        assert_eq!(value.as_object().unwrap().len(), 21);
    }

    #[test]
    fn a_missing_or_wrong_count_is_named() {
        let mut value = serde_json::to_value(sample()).unwrap();
        value["unknown"] = 7.into();
        assert!(serde_json::from_value::<Stats>(value.clone()).is_ok());
        value["num_ooms"] = "two".into();
        let e = serde_json::from_value::<Stats>(value.clone()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "num_ooms: expected a count of bytes or blocks, got \"two\""
        );
        value.as_object_mut().unwrap().remove("segments");
        let e = serde_json::from_value::<Stats>(value).unwrap_err();
        assert_eq!(e.to_string(), "missing field `segments`");
    }
}

//! The engine: one kernel's device, allocator and object world, driven by
//! commands. Each command is one line of Python; the engine carries it out,
//! records the events it caused and reports the stats after it.

use crate::alloc::{Allocator, BlockId, TraceAction, TraceEvent};
use crate::device::{Device, DeviceInfo, SimDevice, SimDeviceConfig};
use crate::framework::{make_allocator, oom_message, Settings, TensorDesc};
use crate::protocol::{
    parse_line, Category, Command, CommandError, Dtype, ErrorKind, Framework, RestartSettings,
    StepRecord,
};
use crate::runtime::{ObjId, ObjectKind, Released, Runtime, Tensor};
use crate::snapshot::{
    BlockSnapshot, Event, EventAction, ObjectSnapshot, SegmentSnapshot, Snapshot, Stats,
};
use crate::units::{format_size, EIB};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// How many events the log keeps (like PyTorch's `max_entries`).
pub const DEFAULT_EVENT_CAPACITY: usize = 10_000;
/// The longest name accepted.
pub const MAX_NAME_LEN: usize = 64;

/// Starts a device for a kernel: the simulated GPU, or a real one.
pub trait DeviceFactory: Send {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError>;
}

/// Starts simulated GPUs.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimDeviceFactory;

impl DeviceFactory for SimDeviceFactory {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        let config = SimDeviceConfig {
            total_bytes: settings.device_total_bytes,
            context_bytes: settings.context_bytes,
            other_processes_bytes: settings.other_processes_bytes,
        };
        config
            .validate()
            .map_err(|m| CommandError::new(ErrorKind::InvalidValue, m))?;
        Ok(Box::new(SimDevice::new(config)))
    }
}

/// What a command did, beyond the stats.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// A short explanation of what happened.
    pub note: Option<String>,
}

pub struct Engine {
    settings: Settings,
    factory: Box<dyn DeviceFactory>,
    device: Box<dyn Device>,
    allocator: Box<dyn Allocator>,
    runtime: Runtime,
    /// Steps executed so far (the next step's index).
    step: u64,
    events: VecDeque<Event>,
    event_capacity: usize,
    next_seq: u64,
    trace: Vec<TraceEvent>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("settings", &self.settings)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

fn name_error(name: &str) -> CommandError {
    CommandError::new(
        ErrorKind::NameError,
        format!("name '{name}' is not defined"),
    )
}

fn check_name(name: &str) -> Result<(), CommandError> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && name.len() <= MAX_NAME_LEN;
    if ok {
        Ok(())
    } else {
        Err(CommandError::new(
            ErrorKind::InvalidValue,
            format!(
                "{name:?} is not a Python name: use letters, digits and _, not starting with a digit, at most {MAX_NAME_LEN} characters"
            ),
        ))
    }
}

impl Engine {
    /// A kernel on the simulated GPU with default settings.
    pub fn new_simulated() -> Self {
        Self::new(Box::new(SimDeviceFactory), Settings::default())
            .expect("default settings start a simulated device")
    }

    pub fn new(
        mut factory: Box<dyn DeviceFactory>,
        settings: Settings,
    ) -> Result<Self, CommandError> {
        settings.validate()?;
        let device = factory.start(&settings)?;
        let allocator = make_allocator(&settings, device.as_ref());
        Ok(Self {
            settings,
            factory,
            device,
            allocator,
            runtime: Runtime::new(),
            step: 0,
            events: VecDeque::new(),
            event_capacity: DEFAULT_EVENT_CAPACITY,
            next_seq: 0,
            trace: Vec::new(),
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn framework(&self) -> Framework {
        self.settings.framework
    }

    pub fn device_info(&self) -> DeviceInfo {
        self.device.info()
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.event_capacity = capacity;
        while self.events.len() > capacity {
            self.events.pop_front();
        }
    }

    /// Parses and executes one line, as `vramlab run` does.
    pub fn run_line(&mut self, line: &str) -> StepRecord {
        let parsed = parse_line(line);
        let result = match &parsed.command {
            Ok(cmd) => self.execute(cmd),
            Err(e) => {
                self.step += 1;
                Err(e.clone())
            }
        };
        let step = self.step - 1;
        match result {
            Ok(outcome) => StepRecord {
                step,
                cmd: parsed.raw,
                ok: true,
                error: None,
                note: outcome.note,
                stats: self.stats(),
            },
            Err(error) => StepRecord {
                step,
                cmd: parsed.raw,
                ok: false,
                error: Some(error),
                note: None,
                stats: self.stats(),
            },
        }
    }

    /// Executes one command. On error nothing changed, except what the
    /// framework itself changes on the way to an OOM (PyTorch returns its
    /// cached segments to the driver before it gives up).
    pub fn execute(&mut self, cmd: &Command) -> Result<Outcome, CommandError> {
        self.step += 1;
        match cmd {
            Command::Restart(patch) => self.restart(patch),
            Command::Alloc {
                name,
                bytes,
                shape,
                dtype,
                category,
            } => self.alloc(
                name,
                *bytes,
                shape.as_deref(),
                *dtype,
                category.unwrap_or_default(),
            ),
            Command::Del { name } => self.del(name),
            Command::Hold { name, items, cycle } => self.hold(name, items, *cycle),
            Command::Gc {} => Ok(self.gc()),
            Command::EmptyCache {} => Ok(self.empty_cache()),
            Command::ClearSession {} => Ok(self.clear_session()),
            Command::ResetPeakMemoryStats {} => {
                self.allocator.reset_peak_stats();
                Ok(Outcome {
                    note: Some("Peaks now equal the current values.".into()),
                })
            }
        }
    }

    fn restart(&mut self, patch: &RestartSettings) -> Result<Outcome, CommandError> {
        let settings = self.settings.patched(patch)?;
        let device = self.factory.start(&settings)?;
        let allocator = make_allocator(&settings, device.as_ref());
        // Drop the old kernel first: its context and segments go back to the driver.
        self.allocator = allocator;
        self.device = device;
        self.runtime.clear();
        self.settings = settings;
        self.push_event(EventAction::Restart, 0, 0, None);
        Ok(Outcome {
            note: Some(format!(
                "The kernel restarted with {}: the process exited, so the driver took back everything, context included; the new process holds only its CUDA context ({}).",
                self.settings.framework.display_name(),
                format_size(self.device.context_bytes())
            )),
        })
    }

    fn alloc(
        &mut self,
        name: &str,
        bytes: Option<u64>,
        shape: Option<&[u64]>,
        dtype: Option<Dtype>,
        category: Category,
    ) -> Result<Outcome, CommandError> {
        check_name(name)?;
        let invalid = |m: String| CommandError::new(ErrorKind::InvalidValue, m);
        let (bytes, shape, dtype) = match (bytes, shape, dtype) {
            (Some(b), None, None) => (b, vec![b], Dtype::Uint8),
            (None, Some(shape), dtype) => {
                let dtype = dtype.unwrap_or(Dtype::Float32);
                let elements = shape
                    .iter()
                    .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                    .and_then(|n| n.checked_mul(dtype.size_bytes()));
                match elements {
                    Some(b) => (b, shape.to_vec(), dtype),
                    None => {
                        return Err(invalid(format!(
                            "shape {shape:?} of {} has more bytes than a 64-bit size can hold",
                            dtype.torch_name()
                        )))
                    }
                }
            }
            (Some(_), Some(_), _) => {
                return Err(CommandError::new(
                    ErrorKind::InvalidCommand,
                    "give either `bytes` or `shape` (with `dtype`), not both",
                ))
            }
            (Some(_), None, Some(_)) => {
                return Err(CommandError::new(
                    ErrorKind::InvalidCommand,
                    "`dtype` goes with `shape`; `bytes` alone allocates uint8",
                ))
            }
            (None, None, _) => {
                return Err(CommandError::new(
                    ErrorKind::InvalidCommand,
                    "alloc needs `bytes`, or `shape` and `dtype`",
                ))
            }
        };
        if bytes >= EIB {
            return Err(invalid(format!(
                "{bytes} bytes is absurd: no GPU has 1 EiB (PyTorch refuses it with \"CUDA out of memory. Tried to allocate more than 1EB memory.\")"
            )));
        }
        let block = match self.allocator.malloc(self.device.as_mut(), bytes) {
            Ok(block) => {
                self.drain_trace(Some(name));
                block
            }
            Err(oom) => {
                self.drain_trace(Some(name));
                let desc = TensorDesc {
                    shape: &shape,
                    dtype,
                };
                return Err(CommandError::new(
                    ErrorKind::OutOfMemory,
                    oom_message(&self.settings, &oom, &desc),
                ));
            }
        };
        let block_size = block.map_or(0, |b| self.allocator.block_size(b));
        let id = self.runtime.new_tensor(
            Tensor {
                block,
                bytes,
                shape,
                dtype,
                category,
            },
            name,
        );
        let released = self.runtime.bind(name, id);
        let freed = self.release(&released);
        let mut note = format!(
            "`{name}` holds a block of {} ({} asked).",
            format_size(block_size),
            format_size(bytes)
        );
        if !released.is_empty() {
            note.push_str(&format!(
                " Rebinding `{name}` dropped the old object's last reference: {} freed, after the new block was taken.",
                format_size(freed)
            ));
        }
        Ok(Outcome { note: Some(note) })
    }

    fn del(&mut self, name: &str) -> Result<Outcome, CommandError> {
        let id = self.runtime.lookup(name).ok_or_else(|| name_error(name))?;
        let holders = self.retention_of(id, name);
        let released = self.runtime.unbind(name).ok_or_else(|| name_error(name))?;
        let freed = self.release(&released);
        let note = if released.is_empty() {
            format!("`del {name}` removed the name only: the object is still referenced ({holders}), so nothing was freed.")
        } else {
            format!(
                "`{name}` was the last reference: {} went back to the allocator's cache (allocated fell; reserved did not).",
                format_size(freed)
            )
        };
        Ok(Outcome { note: Some(note) })
    }

    fn hold(&mut self, name: &str, items: &[String], cycle: bool) -> Result<Outcome, CommandError> {
        check_name(name)?;
        let ids = items
            .iter()
            .map(|item| self.runtime.lookup(item).ok_or_else(|| name_error(item)))
            .collect::<Result<Vec<ObjId>, _>>()?;
        let list = self.runtime.new_list(&ids, cycle, name);
        let released = self.runtime.bind(name, list);
        self.release(&released);
        let mut note = format!("`{name}` is a list holding {} reference(s)", ids.len());
        if cycle {
            note.push_str(" and itself: a reference cycle that only gc.collect() can break");
        }
        note.push('.');
        Ok(Outcome { note: Some(note) })
    }

    fn gc(&mut self) -> Outcome {
        let (found, released) = self.runtime.collect();
        let freed = self.release(&released);
        Outcome {
            note: Some(if found == 0 {
                "gc.collect() found no unreachable objects: every live tensor is still referenced, so nothing was freed.".into()
            } else {
                format!(
                    "gc.collect() found {found} unreachable object(s) kept alive only by reference cycles and freed {} in {} tensor(s).",
                    format_size(freed),
                    released.len()
                )
            }),
        }
    }

    fn empty_cache(&mut self) -> Outcome {
        let released = self.allocator.empty_cache(self.device.as_mut());
        self.drain_trace(None);
        let note = match (released, self.settings.framework) {
            (Some(0), _) if self.settings.no_caching => {
                "With caching off there is no cache: every tensor already went back to the driver when it died.".to_string()
            }
            (Some(0), _) => {
                "empty_cache() released nothing: no segment was entirely free. Live tensors keep their blocks, and free pieces of partly used segments cannot be returned.".to_string()
            }
            (Some(bytes), _) => format!(
                "empty_cache() returned {} of entirely free segments to the driver: reserved and nvidia-smi fell; allocated did not move.",
                format_size(bytes)
            ),
            (None, framework) => format!(
                "{} has no empty_cache(): its BFC pool keeps every byte until the process exits. Nothing changed.",
                framework.display_name()
            ),
        };
        Outcome { note: Some(note) }
    }

    fn clear_session(&mut self) -> Outcome {
        let dropped = self.runtime.clear_framework_state();
        let mut freed = self.release(&dropped);
        let (found, collected) = self.runtime.collect();
        freed += self.release(&collected);
        Outcome {
            note: Some(format!(
                "clear_session() dropped the framework's global state and ran gc.collect() ({found} unreachable object(s)): {} freed inside the pool. The pool itself and nvidia-smi did not shrink.",
                format_size(freed)
            )),
        }
    }

    /// Frees the blocks of tensors that died, in order; returns the bytes.
    fn release(&mut self, released: &[Released]) -> u64 {
        let mut freed = 0;
        for r in released {
            if let Some(block) = r.tensor.block {
                freed += self.allocator.block_size(block);
                self.allocator.free(self.device.as_mut(), block);
                self.drain_trace(Some(&r.label));
            }
        }
        freed
    }

    fn retention_of(&self, id: ObjId, name: &str) -> String {
        let mut holders: Vec<String> = self
            .runtime
            .namespace()
            .iter()
            .filter(|(n, &o)| o == id && n.as_str() != name)
            .map(|(n, _)| format!("name `{n}`"))
            .collect();
        for o in self.runtime.objects().values() {
            if let ObjectKind::List(items) = &o.kind {
                if items.contains(&id) {
                    holders.push(format!("list `{}`", o.label));
                }
            }
        }
        if holders.is_empty() {
            "by the framework's global state".into()
        } else {
            format!("by {}", holders.join(", "))
        }
    }

    fn drain_trace(&mut self, name: Option<&str>) {
        let mut trace = std::mem::take(&mut self.trace);
        self.allocator.drain_trace(&mut trace);
        for e in trace.drain(..) {
            let named = matches!(
                e.action,
                TraceAction::Alloc | TraceAction::Free | TraceAction::Oom
            );
            self.push_event(
                e.action.into(),
                e.address,
                e.size,
                if named { name } else { None },
            );
        }
        self.trace = trace;
    }

    fn push_event(&mut self, action: EventAction, address: u64, size: u64, name: Option<&str>) {
        if self.event_capacity == 0 {
            return;
        }
        if self.events.len() == self.event_capacity {
            self.events.pop_front();
        }
        self.events.push_back(Event {
            seq: self.next_seq,
            step: self.step.saturating_sub(1),
            action,
            address,
            size,
            name: name.map(str::to_string),
        });
        self.next_seq += 1;
    }

    /// Events with `seq >= since`, oldest first.
    pub fn events_since(&self, since: u64) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.seq >= since)
    }

    pub fn stats(&self) -> Stats {
        let a = self.allocator.stats();
        let (free, total) = self.device.mem_get_info();
        Stats {
            allocated_bytes: a.allocated_bytes.current,
            reserved_bytes: a.reserved_bytes.current,
            active_bytes: a.active_bytes.current,
            requested_bytes: a.requested_bytes.current,
            inactive_split_bytes: a.inactive_split_bytes.current,
            peak_allocated_bytes: a.allocated_bytes.peak,
            peak_reserved_bytes: a.reserved_bytes.peak,
            device_used_bytes: self.device.process_used_bytes(),
            device_total_bytes: total,
            device_free_bytes: free,
            segments: a.segment.current,
            num_alloc_retries: a.num_alloc_retries,
            num_ooms: a.num_ooms,
            allocations: a.allocation.current,
            context_bytes: self.device.context_bytes(),
            other_processes_bytes: self.device.other_processes_bytes(),
            num_device_alloc: a.num_device_alloc,
            num_device_free: a.num_device_free,
        }
    }

    /// Live tensors by block, for naming blocks in the map.
    fn owners(&self) -> HashMap<BlockId, (&str, Category)> {
        self.runtime
            .objects()
            .values()
            .filter_map(|o| match &o.kind {
                ObjectKind::Tensor(t) => t.block.map(|b| (b, (o.label.as_str(), t.category))),
                ObjectKind::List(_) => None,
            })
            .collect()
    }

    /// Everything the views draw, with the last `max_events` events.
    pub fn snapshot(&self, max_events: usize) -> Snapshot {
        let owners = self.owners();
        let mut categories: BTreeMap<Category, u64> = BTreeMap::new();
        let segments = self
            .allocator
            .segments()
            .into_iter()
            .map(|s| {
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
                        if let Some((_, c)) = owner {
                            *categories.entry(*c).or_default() += b.size;
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
                    pool: s.pool.to_string(),
                    blocks,
                }
            })
            .collect();
        let names = self.runtime.names_of();
        let why = self.runtime.retention();
        let objects = self
            .runtime
            .objects()
            .iter()
            .map(|(&id, o)| {
                let (kind, bytes, category) = match &o.kind {
                    ObjectKind::Tensor(t) => (
                        "Tensor",
                        t.block.map_or(0, |b| self.allocator.block_size(b)),
                        Some(t.category),
                    ),
                    ObjectKind::List(_) => ("list", 0, None),
                };
                ObjectSnapshot {
                    id,
                    kind: kind.into(),
                    label: o.label.clone(),
                    names: names.get(&id).cloned().unwrap_or_default(),
                    bytes,
                    refcount: o.refcount,
                    category,
                    kept_alive_by: why.get(&id).cloned().unwrap_or_default(),
                }
            })
            .collect();
        let skip = self.events.len().saturating_sub(max_events);
        Snapshot {
            step: self.step,
            framework: self.settings.framework,
            device: self.device.info(),
            stats: self.stats(),
            segments,
            objects,
            categories,
            events: self.events.iter().skip(skip).cloned().collect(),
        }
    }

    /// Checks every invariant of the allocator, the runtime and their
    /// agreement; `Err` names the first broken one.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.allocator.check_invariants(self.device.as_ref())?;
        self.runtime.check_invariants()?;
        let stats = self.stats();
        if stats.device_used_bytes != stats.context_bytes + self.device.segment_bytes() {
            return Err("device used is not context + segments".into());
        }
        if stats.device_used_bytes + stats.other_processes_bytes + stats.device_free_bytes
            != stats.device_total_bytes
        {
            return Err("used + others + free is not the device total".into());
        }
        let live: Vec<BlockId> = self.owners().keys().copied().collect();
        let allocated = self
            .allocator
            .segments()
            .iter()
            .flat_map(|s| s.blocks.iter().filter_map(|b| b.id))
            .count();
        if live.len() != allocated {
            return Err(format!(
                "{} live tensors own blocks but the allocator has {allocated} allocated",
                live.len()
            ));
        }
        Ok(())
    }

    /// Switches event recording in the allocator (benchmarks switch it off).
    pub fn set_tracing(&mut self, on: bool) {
        self.allocator.set_tracing(on);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    fn run(engine: &mut Engine, line: &str) -> StepRecord {
        let r = engine.run_line(line);
        engine.check_invariants().unwrap();
        r
    }

    #[test]
    fn del_vs_empty_cache_vs_context() {
        let mut e = Engine::new_simulated();
        let r = run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":67108864}"#);
        assert!(r.ok);
        assert_eq!(r.stats.allocated_bytes, 64 * MIB);
        assert_eq!(r.stats.device_used_bytes, 364 * MIB);
        let r = run(&mut e, r#"{"cmd":"del","name":"x"}"#);
        assert_eq!(r.stats.allocated_bytes, 0);
        assert_eq!(r.stats.reserved_bytes, 64 * MIB);
        let r = run(&mut e, r#"{"cmd":"empty_cache"}"#);
        assert_eq!(r.stats.reserved_bytes, 0);
        assert_eq!(r.stats.device_used_bytes, 300 * MIB);
        assert_eq!(r.step, 2);
    }

    #[test]
    fn errors_change_nothing() {
        let mut e = Engine::new_simulated();
        run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1000}"#);
        let before = e.snapshot(0);
        for line in [
            "not json",
            r#"{"cmd":"del","name":"nope"}"#,
            r#"{"cmd":"alloc","name":"9x","bytes":1}"#,
            r#"{"cmd":"alloc","name":"y","bytes":2305843009213693952}"#,
            r#"{"cmd":"alloc","name":"y","shape":[4294967296,4294967296,16]}"#,
            r#"{"cmd":"hold","name":"h","items":["x","ghost"]}"#,
            r#"{"cmd":"restart","mem_fraction":7}"#,
        ] {
            let r = run(&mut e, line);
            assert!(!r.ok, "{line}");
            let mut after = e.snapshot(0);
            after.step = before.step;
            assert_eq!(after, before, "{line}");
        }
    }

    #[test]
    fn name_error_text_is_pythons() {
        let mut e = Engine::new_simulated();
        let r = run(&mut e, r#"{"cmd":"del","name":"x"}"#);
        let err = r.error.unwrap();
        assert_eq!(err.kind, ErrorKind::NameError);
        assert_eq!(err.message, "name 'x' is not defined");
    }

    #[test]
    fn events_are_tagged_with_their_step() {
        let mut e = Engine::new_simulated();
        run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1000}"#);
        run(&mut e, r#"{"cmd":"del","name":"x"}"#);
        run(&mut e, r#"{"cmd":"empty_cache"}"#);
        let ev: Vec<(u64, EventAction, Option<String>)> = e
            .events_since(0)
            .map(|e| (e.step, e.action, e.name.clone()))
            .collect();
        assert_eq!(
            ev,
            vec![
                (0, EventAction::SegmentAlloc, None),
                (0, EventAction::Alloc, Some("x".into())),
                (1, EventAction::Free, Some("x".into())),
                (2, EventAction::SegmentFree, None),
            ]
        );
    }

    #[test]
    fn snapshot_names_owners_and_chains() {
        let mut e = Engine::new_simulated();
        run(
            &mut e,
            r#"{"cmd":"alloc","name":"x","shape":[1024,1024],"dtype":"float32","category":"activation"}"#,
        );
        run(
            &mut e,
            r#"{"cmd":"hold","name":"h","items":["x"],"cycle":true}"#,
        );
        run(&mut e, r#"{"cmd":"del","name":"x"}"#);
        let s = e.snapshot(100);
        assert_eq!(s.categories[&Category::Activation], 4 * MIB);
        let owner = s.segments[0].blocks[0].owner.clone();
        assert_eq!(owner.as_deref(), Some("x"));
        let x = s.objects.iter().find(|o| o.label == "x").unwrap();
        assert_eq!(x.kept_alive_by, "name `h` -> list `h`");
        assert_eq!(x.refcount, 1);
    }
}

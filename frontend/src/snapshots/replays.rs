//! A PyTorch memory snapshot the user opened: read and replayed in the
//! page (the engine in `shared` is compiled into the app; nothing is
//! uploaded), a what-if run beside it, and the trace event being looked at.

use crate::clock::now_ms;
use crate::files;
use leptos::prelude::*;
use std::sync::Arc;
use vramlab_shared::framework::RestartSettings;
use vramlab_shared::snapshot::SegmentSnapshot;
use vramlab_shared::torch_snapshot::diff::Diff;
use vramlab_shared::torch_snapshot::fix::{self, FixReport};
use vramlab_shared::torch_snapshot::replay::{
    default_device, export_what_if, recorded_ooms, replay_exact, replay_what_if, segments_at, thin,
    ReplayRun, TimelinePoint,
};
use vramlab_shared::torch_snapshot::{self, Action, MemorySnapshot};

/// The most events a recording may have for its fix to be searched as it
/// opens (each setting is a replay: about a second at this size).
const AUTO_FIX_EVENTS: usize = 300_000;

/// A file read and replayed under its recorded settings.
pub struct Opened {
    pub name: String,
    pub bytes: usize,
    pub snapshot: Arc<MemorySnapshot>,
    /// The trace replayed: the first with an out-of-memory, else the
    /// busiest, until the user picks another.
    pub device: usize,
    /// The exact replay; for a recording it cannot follow exactly, the
    /// replay under its recorded settings.
    pub recorded: ReplayRun,
    /// Why `recorded` is not an exact replay.
    pub inexact: Option<String>,
    pub chart: Vec<TimelinePoint>,
    /// Reading and replaying, in the page.
    pub ms: f64,
}

impl Opened {
    pub fn trace(&self) -> &torch_snapshot::Trace {
        self.snapshot.trace(self.device)
    }
}

/// The same trace under other settings.
pub struct WhatIf {
    /// What the user asked for (what the command line's `--what-if` says).
    pub asked: RestartSettings,
    /// What replays it: in the room the recording's process had, where it
    /// ran out of memory and no card or size is named (as the fix and the
    /// command line replay it).
    pub settings: RestartSettings,
    pub run: ReplayRun,
    pub chart: Vec<TimelinePoint>,
    pub ms: f64,
}

/// Whose segments the map shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    Recorded,
    WhatIf,
}

#[derive(Clone, Copy)]
pub struct Replays {
    pub opened: RwSignal<Option<Arc<Opened>>>,
    pub what_if: RwSignal<Option<Arc<WhatIf>>>,
    /// Why a file did not open.
    pub error: RwSignal<Option<String>>,
    /// How far a file has been read, while it is.
    pub progress: RwSignal<Option<String>>,
    /// Why the what-if did not run (shown beside its button).
    pub what_if_error: RwSignal<Option<String>>,
    /// The trace event being looked at.
    pub selected: RwSignal<usize>,
    pub shown: RwSignal<Shown>,
    /// Two runs compared, the fix searched, a window of events (what
    /// `compare` does with them).
    pub compare: Compare,
}

impl Replays {
    pub fn new() -> Self {
        Self {
            opened: RwSignal::new(None),
            what_if: RwSignal::new(None),
            error: RwSignal::new(None),
            progress: RwSignal::new(None),
            what_if_error: RwSignal::new(None),
            selected: RwSignal::new(0),
            shown: RwSignal::new(Shown::Recorded),
            compare: Compare::new(),
        }
    }

    /// Reads and replays a file; on failure the error says why and what
    /// was open stays open.
    pub fn open(&self, name: String, bytes: Vec<u8>) {
        let start = now_ms();
        let len = bytes.len();
        match torch_snapshot::read(&bytes) {
            // The file's bytes go before the replay, which reuses their room.
            Ok(snapshot) => self.open_read(name, len, snapshot, start),
            Err(why) => self.error.set(Some(why.to_string())),
        }
    }

    /// Replays a snapshot read from a file of `bytes` bytes.
    pub fn open_read(&self, name: String, bytes: usize, snapshot: MemorySnapshot, start: f64) {
        self.compare.whole.set(None);
        let device = default_device(&snapshot);
        let loaded = load(name, bytes, Arc::new(snapshot), device);
        self.show(loaded, start);
    }

    /// Reads `file` (saying how far), then `then` with what was read and
    /// when the reading started; why it could not goes to `error`.
    pub fn read_then(
        &self,
        file: web_sys::File,
        error: RwSignal<Option<String>>,
        then: impl FnOnce(String, usize, MemorySnapshot, f64) + 'static,
    ) {
        crate::snapshots::reading::read_snapshot(file, self.progress, move |read| {
            match read.snapshot {
                Ok(snapshot) => then(read.name, read.bytes, snapshot, read.started),
                Err(why) => error.set(Some(why)),
            }
        });
    }

    /// Replays another device's trace of the open file.
    pub fn open_device(&self, device: usize) {
        let Some(opened) = self.opened.get_untracked() else {
            return;
        };
        let start = now_ms();
        let loaded = load(
            opened.name.clone(),
            opened.bytes,
            opened.snapshot.clone(),
            device,
        );
        self.show(loaded, start);
    }

    /// Opens `loaded` (or says why it did not open), after `start`.
    pub(crate) fn show(&self, loaded: Result<Opened, String>, start: f64) {
        match loaded {
            Ok(mut opened) => {
                opened.ms = now_ms() - start;
                self.compare.clear();
                self.selected.set(first_interesting(&opened));
                self.what_if.set(None);
                self.what_if_error.set(None);
                self.shown.set(Shown::Recorded);
                self.error.set(None);
                // An out-of-memory is what its engineer came for: the fix is
                // searched at once where that takes a moment.
                let ooms = recorded_ooms(&opened.snapshot, opened.device);
                let events = opened.snapshot.trace(opened.device).len();
                self.opened.set(Some(Arc::new(opened)));
                if ooms > 0 && events <= AUTO_FIX_EVENTS {
                    self.search_fix();
                }
            }
            Err(why) => self.error.set(Some(why)),
        }
    }

    /// Replays the open trace under `asked`.
    pub fn run_what_if(&self, asked: RestartSettings) {
        let Some(opened) = self.opened.get_untracked() else {
            return;
        };
        let start = now_ms();
        let settings = match fix::room(&opened.snapshot, opened.device, &opened.recorded) {
            Some(room) => fix::in_the_room(asked.clone(), room),
            None => asked.clone(),
        };
        match replay_what_if(&opened.snapshot, opened.device, &settings) {
            Ok(run) => {
                let chart = thin(&run.timeline);
                self.what_if_error.set(None);
                self.what_if.set(Some(Arc::new(WhatIf {
                    asked,
                    settings,
                    run,
                    chart,
                    ms: now_ms() - start,
                })));
                self.shown.set(Shown::WhatIf);
            }
            Err(why) => {
                self.what_if.set(None);
                self.shown.set(Shown::Recorded);
                self.what_if_error.set(Some(why.to_string()));
            }
        }
    }

    /// Saves the what-if run as a snapshot file next to the opened one's
    /// name.
    pub fn save_what_if(&self) {
        let (Some(opened), Some(what_if)) =
            (self.opened.get_untracked(), self.what_if.get_untracked())
        else {
            return;
        };
        let saved = export_what_if(&opened.snapshot, opened.device, &what_if.settings)
            .map_err(|e| e.to_string())
            .and_then(|s| {
                let stem = opened
                    .name
                    .rsplit_once('.')
                    .map_or(&*opened.name, |(s, _)| s);
                let name = format!("{stem}-what-if.pickle");
                files::download(
                    &name,
                    &torch_snapshot::write_pickle(&s),
                    "application/octet-stream",
                )
            });
        if let Err(why) = saved {
            self.what_if_error.set(Some(why));
        }
    }

    /// The segments after the selected event, in the run shown.
    pub fn segments(&self) -> Option<Result<Vec<SegmentSnapshot>, String>> {
        let opened = self.opened.get()?;
        let event = self.selected.get();
        let what_if = match (self.shown.get(), self.what_if.get()) {
            (Shown::WhatIf, Some(w)) => Some(w.settings.clone()),
            _ => opened.inexact.as_ref().map(|_| RestartSettings::default()),
        };
        Some(
            segments_at(&opened.snapshot, opened.device, what_if.as_ref(), event)
                .map_err(|e| e.to_string()),
        )
    }
}

pub(crate) fn load(
    name: String,
    bytes: usize,
    snapshot: Arc<MemorySnapshot>,
    device: usize,
) -> Result<Opened, String> {
    if snapshot.trace(device).is_empty() {
        return Err(match snapshot.device_traces.len() {
            0 | 1 => format!(
                "{name} holds no trace events: record with torch.cuda.memory._record_memory_history() before the run, then _dump_snapshot()"
            ),
            _ => format!("{name} holds no trace events for CUDA device {device}"),
        });
    }
    let (recorded, inexact) = match replay_exact(&snapshot, device) {
        Ok(run) => (run, None),
        Err(why) => (
            replay_what_if(&snapshot, device, &RestartSettings::default())
                .map_err(|e| e.to_string())?,
            Some(why.to_string()),
        ),
    };
    Ok(Opened {
        name,
        bytes,
        chart: thin(&recorded.timeline),
        snapshot,
        device,
        recorded,
        inexact,
        ms: 0.0,
    })
}

/// Where to look first: the first recorded out-of-memory, else where
/// reserved memory peaked.
fn first_interesting(opened: &Opened) -> usize {
    if let Some(oom) =
        (0..opened.trace().len()).position(|i| opened.trace().action(i) == Action::Oom)
    {
        return oom;
    }
    let peak = opened.recorded.peak_reserved_bytes;
    opened
        .recorded
        .timeline
        .iter()
        .find(|p| p.reserved_bytes == peak)
        .map_or(0, |p| p.event)
}

/// Two recordings compared at their peaks of allocated memory.
pub struct Compared {
    pub a_name: String,
    pub b_name: String,
    /// The `vramlab` command that prints the same.
    pub command: String,
    pub diff: Diff,
    pub ms: f64,
}

/// The fix searched (`None`: the trace has no out-of-memory).
pub struct Fixed {
    pub report: Option<FixReport>,
    pub ms: f64,
}

/// The whole recording, while a window of it is open.
#[derive(Clone)]
pub struct Whole {
    pub name: String,
    pub bytes: usize,
    pub snapshot: Arc<MemorySnapshot>,
    pub device: usize,
}

#[derive(Clone, Copy)]
pub struct Compare {
    pub diff: RwSignal<Option<Arc<Compared>>>,
    pub fix: RwSignal<Option<Arc<Fixed>>>,
    /// Whether the fix is being searched (each candidate is a replay).
    pub searching: RwSignal<bool>,
    /// Why the comparison, the fix or the window did not run.
    pub error: RwSignal<Option<String>>,
    pub whole: RwSignal<Option<Whole>>,
}

impl Compare {
    pub fn new() -> Self {
        Self {
            diff: RwSignal::new(None),
            fix: RwSignal::new(None),
            searching: RwSignal::new(false),
            error: RwSignal::new(None),
            whole: RwSignal::new(None),
        }
    }

    /// Another trace opened: what was said of the last one goes.
    pub fn clear(&self) {
        self.diff.set(None);
        self.fix.set(None);
        self.error.set(None);
    }
}

//! What the snapshot page does with an opened trace beyond replaying it:
//! compares it with another recording or with its what-if (`vramlab diff`),
//! searches the settings that would have avoided its out-of-memory
//! (`vramlab replay --fix`), and opens a window of its events
//! (`--events I..J`, `--around-peak N`).

use crate::clock::{after_paint, now_ms};
use crate::snapshots::replays::{load, Compared, Fixed, Replays, Whole};
use leptos::prelude::*;
use std::ops::Range;
use std::sync::Arc;
use vramlab_shared::torch_snapshot::diff::diff;
use vramlab_shared::torch_snapshot::fix::search_fix;
use vramlab_shared::torch_snapshot::replay::{default_device, export_what_if};
use vramlab_shared::torch_snapshot::what_if::describe_what_if;
use vramlab_shared::torch_snapshot::window::{around_peak, window};
use vramlab_shared::torch_snapshot::MemorySnapshot;

impl Replays {
    /// Compares the open trace (A) with `b`, read from the file `name`.
    pub fn compare_with(&self, name: String, b: MemorySnapshot) {
        let Some(a) = self.opened.get_untracked() else {
            return;
        };
        let start = now_ms();
        let device = default_device(&b);
        let compared = diff((&a.snapshot, a.device), (&b, device))
            .map_err(|e| e.to_string())
            .map(|diff| Compared {
                command: format!("vramlab diff {} {name}", a.name),
                a_name: a.name.clone(),
                b_name: name,
                diff,
                ms: now_ms() - start,
            });
        show_diff(self, compared);
    }

    /// Compares the open trace (A) with its what-if run (B).
    pub fn compare_with_what_if(&self) {
        let (Some(a), Some(w)) = (self.opened.get_untracked(), self.what_if.get_untracked()) else {
            return;
        };
        let start = now_ms();
        let what_if = describe_what_if(&w.asked);
        let compared = export_what_if(&a.snapshot, a.device, &w.settings)
            .and_then(|b| diff((&a.snapshot, a.device), (&b, a.device)))
            .map_err(|e| e.to_string())
            .map(|diff| Compared {
                command: format!(
                    "vramlab replay {0} --what-if '{what_if}' --export-snapshot what-if.pickle && vramlab diff {0} what-if.pickle",
                    a.name
                ),
                a_name: a.name.clone(),
                b_name: format!("what if {what_if}"),
                diff,
                ms: now_ms() - start,
            });
        show_diff(self, compared);
    }

    /// Searches the fix, after the page has said it is searching.
    pub fn search_fix(&self) {
        let Some(opened) = self.opened.get_untracked() else {
            return;
        };
        let compare = self.compare;
        compare.searching.set(true);
        after_paint(move || {
            let start = now_ms();
            match search_fix(&opened.snapshot, opened.device) {
                Ok(report) => {
                    compare.error.set(None);
                    compare.fix.set(Some(Arc::new(Fixed {
                        report,
                        ms: now_ms() - start,
                    })));
                }
                Err(why) => compare.error.set(Some(why.to_string())),
            }
            compare.searching.set(false);
        });
    }

    /// Opens events `range` of the whole recording as a recording of
    /// their own.
    pub fn open_window(&self, range: Range<usize>) {
        let Some(whole) = self.whole() else {
            return;
        };
        let start = now_ms();
        let name = format!("{} events {}..{}", whole.name, range.start, range.end);
        let loaded = window(&whole.snapshot, whole.device, range)
            .map_err(|e| e.to_string())
            .and_then(|w| load(name, whole.bytes, Arc::new(w), whole.device));
        if loaded.is_ok() {
            self.compare.whole.set(Some(whole));
        }
        self.show(loaded, start);
    }

    /// Opens the `n` events either side of the moment allocated memory
    /// peaks in the whole recording.
    pub fn open_around_peak(&self, n: usize) {
        let Some(whole) = self.whole() else {
            return;
        };
        match around_peak(&whole.snapshot, whole.device, n) {
            Ok((range, _)) => self.open_window(range),
            Err(why) => self.compare.error.set(Some(why.to_string())),
        }
    }

    /// Back to the whole recording.
    pub fn open_whole(&self) {
        let Some(whole) = self.compare.whole.get_untracked() else {
            return;
        };
        let start = now_ms();
        self.compare.whole.set(None);
        let loaded = load(whole.name, whole.bytes, whole.snapshot, whole.device);
        self.show(loaded, start);
    }

    /// The recording a window is cut from: the whole one kept, else the
    /// one open.
    fn whole(&self) -> Option<Whole> {
        self.compare.whole.get_untracked().or_else(|| {
            self.opened.get_untracked().map(|o| Whole {
                name: o.name.clone(),
                bytes: o.bytes,
                snapshot: o.snapshot.clone(),
                device: o.device,
            })
        })
    }
}

fn show_diff(r: &Replays, compared: Result<Compared, String>) {
    match compared {
        Ok(c) => {
            r.compare.error.set(None);
            r.compare.diff.set(Some(Arc::new(c)));
        }
        Err(why) => r.compare.error.set(Some(why)),
    }
}

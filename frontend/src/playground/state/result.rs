//! A command's result: the numbers, the timeline's point, the explanation
//! of what moved and why, the lesson's check, the banner (an out-of-memory
//! named by the framework's exception class).

use super::{history, App, Explanation};
use history::Point;
use leptos::prelude::*;
use vramlab_shared::explain;
use vramlab_shared::framework::oom_exception;
use vramlab_shared::lesson::predict::Number;
use vramlab_shared::protocol::StepRecord;
use vramlab_shared::{ErrorKind, Stats};

impl App {
    pub(super) fn on_result(&self, id: u64, record: StepRecord) {
        self.memory.progress.set(None);
        // The result's stats are the state after the command; the segment
        // map and the tables follow with the next delta.
        self.memory.stats.set(Some(record.stats.clone()));
        self.memory.last_step.set(Some(record.step));
        self.memory.results.update(|n| *n += 1);
        let before = self
            .memory
            .after_result
            .try_update_value(|s| s.replace(record.stats.clone()))
            .flatten();
        let mut pending = self.outbox.pending.try_update(|p| p.remove(&id)).flatten();
        // What this command changed is measured from the result before it,
        // not from the numbers shown when it was sent (others were in flight).
        if let (Some(p), Some(before)) = (&mut pending, before) {
            p.before = before;
        }
        self.play.on_result(id, &record);
        let label = record
            .cmd
            .get("cmd")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        let restart = record.settings.is_some();
        let point = Point::new(
            &record.stats,
            record.stats.step_peak_allocated_bytes,
            label.map(|l| (record.step, l)),
        );
        self.memory
            .history
            .update(|h| history::push_result(h, point, restart));
        self.follow_restart(&record);
        if let Some(p) = &pending {
            let why = match &record.error {
                Some(e) => e.message.clone(),
                None => record.note.clone().unwrap_or_default(),
            };
            let said = Explanation {
                moved: explain::moved(&p.before, &record.stats),
                why,
                link: {
                    let (title, url) = explain::fact_link(&p.command, self.framework());
                    (title.into(), url.into())
                },
                ok: record.ok,
            };
            // A statement of the cell is explained whole: from the numbers
            // before its first command to those after its last.
            match self
                .cell
                .on_result(id, &record, &p.before, Some(said.clone()))
            {
                Some(i) => self.explain_statement(i),
                None => self.explain(&p.before, &record.stats, said),
            }
            self.check_lesson(p, &record);
        } else {
            self.cell.on_result(id, &record, &record.stats, None);
        }
        match &record.error {
            Some(e) if e.kind == ErrorKind::OutOfMemory => {
                let exception = oom_exception(self.framework());
                self.words
                    .banner
                    .set(Some(format!("{exception}: {}", e.message)));
            }
            Some(e) => self.words.banner.set(Some(e.message.clone())),
            None => self.words.banner.set(None),
        }
        if self.moving.with_untracked(|m| m.in_flight == Some(id)) {
            self.after_moved_line();
        }
    }

    /// The explanation under the numbers: `said`, which moved them from
    /// `before` to `after`.
    fn explain(&self, before: &Stats, after: &Stats, said: Explanation) {
        self.words.explanation.set(Some(said));
        self.words.moved.set(
            [Number::Allocated, Number::Reserved, Number::NvidiaSmi]
                .into_iter()
                .filter(|n| n.of(before) != n.of(after))
                .collect(),
        );
    }

    /// Statement `i` of the cell explained (the last run, or the one clicked).
    pub fn explain_statement(&self, i: usize) {
        let Some((before, after, said)) = self.cell.explanation(i) else {
            return;
        };
        self.cell.selected.set(Some(i));
        self.explain(&before, &after, said);
    }

    /// A restart may change the framework and settings: the hello came
    /// before it, so take what the result says (owners and watchers alike).
    pub(super) fn follow_restart(&self, record: &StepRecord) {
        let Some(settings) = &record.settings else {
            return;
        };
        self.link.hello.update(|h| {
            if let Some(h) = h {
                h.framework = settings.framework;
                h.settings = settings.clone();
                if let Some(device) = &record.device {
                    h.device = device.clone();
                }
            }
        });
        self.save_url();
    }
}

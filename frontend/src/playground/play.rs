//! ▶ play: a training run sent one step at a time at a chosen pace, so
//! every step's numbers, its peak and its loss reach the screen (the
//! timeline draws the sawtooth, the loss curve the learning). This holds
//! the run's state; the training view sends each step when `due` ticks.

use leptos::prelude::*;
use std::time::Duration;
use vramlab_shared::command::{Command, CommandLine, TrainArgs};
use vramlab_shared::protocol::StepRecord;

#[derive(Clone, Copy)]
pub struct Play {
    /// Steps still to send (0: not playing).
    pub left: RwSignal<u64>,
    /// Steps this run asked for.
    pub total: RwSignal<u64>,
    /// Steps whose result came back.
    pub done: RwSignal<u64>,
    /// The pause between steps.
    pub every_ms: RwSignal<u64>,
    /// Each computed step's loss, in order.
    pub losses: RwSignal<Vec<f64>>,
    /// Whether a step ran shape-only (no loss to plot).
    pub shape_only: RwSignal<bool>,
    /// The shortest pause the server's command rate allows.
    pub min_ms: RwSignal<u64>,
    /// Why the run stopped early, when the server refused a step.
    pub refused: RwSignal<Option<String>>,
    /// Ticks when the next step should be sent.
    pub due: RwSignal<u64>,
    args: RwSignal<Option<TrainArgs>>,
    /// The step in flight.
    waiting: RwSignal<Option<u64>>,
}

impl Play {
    pub fn new() -> Self {
        Play {
            left: RwSignal::new(0),
            total: RwSignal::new(0),
            done: RwSignal::new(0),
            every_ms: RwSignal::new(100),
            losses: RwSignal::new(Vec::new()),
            shape_only: RwSignal::new(false),
            min_ms: RwSignal::new(0),
            refused: RwSignal::new(None),
            due: RwSignal::new(0),
            args: RwSignal::new(None),
            waiting: RwSignal::new(None),
        }
    }

    /// Starts a run of `args.steps` steps; the page sends each step when
    /// [`Play::due`] ticks (the first one at once).
    pub fn begin(&self, args: TrainArgs) {
        self.total.set(args.steps);
        self.left.set(args.steps);
        self.done.set(0);
        self.losses.set(Vec::new());
        self.shape_only.set(false);
        self.refused.set(None);
        self.args.set(Some(TrainArgs { steps: 1, ..args }));
        self.due.update(|n| *n += 1);
    }

    /// The presenter's run, on a watcher's page (nothing is sent here).
    pub fn mirror(&self, done: u64, total: u64, losses: Vec<f64>) {
        self.total.set(total);
        self.done.set(done);
        self.shape_only.set(losses.is_empty() && done > 0);
        self.losses.set(losses);
    }

    pub fn stop(&self) {
        self.left.set(0);
    }

    /// The next step's line, if the run goes on.
    pub fn next_line(&self) -> Option<CommandLine> {
        let args = self.args.get_untracked()?;
        if self.left.get_untracked() == 0 || self.waiting.get_untracked().is_some() {
            return None;
        }
        self.left.update(|l| *l -= 1);
        Some(CommandLine::from(Command::Train(args)))
    }

    /// The step just sent went out under this id.
    pub fn sent(&self, id: Option<u64>) {
        self.waiting.set(id);
    }

    /// The server refused a message: if it was the step in flight, the run
    /// stops and says why.
    pub fn on_error(&self, id: u64, why: &str) {
        if self.waiting.get_untracked() == Some(id) {
            self.waiting.set(None);
            self.stop();
            self.refused.set(Some(why.to_string()));
        }
    }

    /// A result: if it is the step in flight, note its loss and send the
    /// next one after the pause.
    pub fn on_result(&self, id: u64, record: &StepRecord) {
        if self.waiting.get_untracked() != Some(id) {
            return;
        }
        self.waiting.set(None);
        self.done.update(|d| *d += 1);
        let loss = record.value.as_ref().and_then(|v| v["last_loss"].as_f64());
        match loss {
            Some(l) => self.losses.update(|ls| ls.push(l)),
            None => self.shape_only.set(true),
        }
        if !record.ok {
            self.stop();
            return;
        }
        let due = self.due;
        set_timeout(
            move || due.update(|n| *n += 1),
            Duration::from_millis(
                self.every_ms
                    .get_untracked()
                    .max(self.min_ms.get_untracked()),
            ),
        );
    }
}

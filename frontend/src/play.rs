//! ▶ play: a training run sent one step at a time at a chosen pace, so
//! every step's numbers, its peak and its loss reach the screen (the
//! timeline draws the sawtooth, the loss curve the learning). The cell and
//! the Python pane get the loop once, as written.

use crate::state::App;
use leptos::prelude::*;
use std::time::Duration;
use vramlab_shared::command::{Command, CommandLine, TrainArgs};
use vramlab_shared::protocol::StepRecord;
use vramlab_shared::python;

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
            args: RwSignal::new(None),
            waiting: RwSignal::new(None),
        }
    }

    /// Starts a run of `args.steps` steps.
    pub fn start(&self, app: App, args: TrainArgs) {
        let code = python::code(&Command::Train(args.clone()), app.framework());
        app.cell.record(&code);
        app.code.update(|c| c.push(code));
        self.total.set(args.steps);
        self.left.set(args.steps);
        self.done.set(0);
        self.losses.set(Vec::new());
        self.shape_only.set(false);
        self.args.set(Some(TrainArgs { steps: 1, ..args }));
        self.send_next(app);
    }

    pub fn stop(&self) {
        self.left.set(0);
    }

    fn send_next(&self, app: App) {
        let Some(args) = self.args.get_untracked() else {
            return;
        };
        if self.left.get_untracked() == 0 {
            return;
        }
        self.left.update(|l| *l -= 1);
        let line = CommandLine::from(Command::Train(args));
        self.waiting.set(app.submit_quietly(line));
    }

    /// A result: if it is the step in flight, note its loss and send the
    /// next one after the pause.
    pub fn on_result(&self, app: App, id: u64, record: &StepRecord) {
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
        let this = *self;
        set_timeout(
            move || this.send_next(app),
            Duration::from_millis(self.every_ms.get_untracked()),
        );
    }
}

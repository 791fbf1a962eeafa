//! The code cell's state: its text, its statements with the commands each
//! stands for, which have run, and the numbers before and after each (the
//! popular advice's claims are judged on them).

use leptos::prelude::*;
use vramlab_shared::advice::Run;
use vramlab_shared::cell::{self, CellError};
use vramlab_shared::command::Command;
use vramlab_shared::protocol::StepRecord;
use vramlab_shared::types::Framework;
use vramlab_shared::Stats;

#[derive(Clone, Debug, PartialEq)]
pub enum StepState {
    Waiting,
    Running,
    Done,
    Failed(String),
}

#[derive(Clone, Debug)]
pub struct CellStep {
    pub lines: (usize, usize),
    pub source: String,
    pub commands: Result<Vec<Command>, CellError>,
    pub state: StepState,
    pub after: Option<Stats>,
    pending: usize,
}

#[derive(Clone, Copy)]
pub struct CellState {
    pub source: RwSignal<String>,
    pub steps: RwSignal<Vec<CellStep>>,
    /// The statement a step runs next.
    pub next: RwSignal<usize>,
    /// A syntax error, or why nothing ran.
    pub error: RwSignal<Option<String>>,
    /// The advice loaded (an index into `ADVICE`).
    pub advice: RwSignal<Option<usize>>,
    /// The numbers after the restart that starts a run.
    start: RwSignal<Option<Stats>>,
    /// Which statement each command sent belongs to (`None`: the restart),
    /// by the command's id (few are in flight at once).
    ids: RwSignal<Vec<(u64, Option<usize>)>>,
}

impl CellState {
    pub fn new() -> Self {
        CellState {
            source: RwSignal::new(String::new()),
            steps: RwSignal::new(Vec::new()),
            next: RwSignal::new(0),
            error: RwSignal::new(None),
            advice: RwSignal::new(None),
            start: RwSignal::new(None),
            ids: RwSignal::new(Vec::new()),
        }
    }

    /// Reads the text afresh; false (with the error shown) on a syntax error.
    pub fn load(&self, framework: Framework) -> bool {
        self.next.set(0);
        self.start.set(None);
        self.ids.set(Vec::new());
        match cell::steps(&self.source.get_untracked(), framework) {
            Ok(steps) => {
                self.steps.set(steps.into_iter().map(fresh).collect());
                self.error.set(None);
                true
            }
            Err(e) => {
                self.steps.set(Vec::new());
                self.error.set(Some(e.to_string()));
                false
            }
        }
    }

    /// Whether the next step starts a run (nothing has run since the text changed).
    pub fn at_start(&self) -> bool {
        self.next.get_untracked() == 0
    }

    /// The next statement's index and commands; it is now running.
    pub fn take_next(&self) -> Option<(usize, Result<Vec<Command>, CellError>)> {
        let i = self.next.get_untracked();
        let commands = self
            .steps
            .with_untracked(|s| s.get(i).map(|s| s.commands.clone()))?;
        self.next.set(i + 1);
        self.update(i, |s| match &commands {
            Ok(c) if c.is_empty() => s.state = StepState::Done,
            Ok(c) => {
                s.state = StepState::Running;
                s.pending = c.len();
            }
            Err(e) => s.state = StepState::Failed(e.message.clone()),
        });
        Some((i, commands))
    }

    /// A command of statement `step` (or the run's restart) was sent as `id`.
    pub fn sent(&self, step: Option<usize>, id: u64) {
        self.ids.update(|m| m.push((id, step)));
    }

    /// A result came: the statement it belongs to takes its numbers.
    pub fn on_result(&self, id: u64, record: &StepRecord) {
        let taken = self.ids.try_update(|m| {
            let at = m.iter().position(|(sent, _)| *sent == id)?;
            Some(m.swap_remove(at).1)
        });
        let Some(step) = taken.flatten() else {
            return;
        };
        let Some(i) = step else {
            self.start.set(Some(record.stats.clone()));
            return;
        };
        self.update(i, |s| {
            s.after = Some(record.stats.clone());
            s.pending = s.pending.saturating_sub(1);
            match &record.error {
                Some(e) => s.state = StepState::Failed(e.message.clone()),
                None if s.pending == 0 && s.state == StepState::Running => {
                    s.state = StepState::Done
                }
                None => {}
            }
        });
    }

    /// A button's line joins the cell as a statement that has run.
    pub fn record(&self, code: &str) {
        self.source.update(|s| {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            s.push_str(code);
            s.push('\n');
        });
        self.steps.set(Vec::new());
        self.next.set(0);
    }

    fn update(&self, i: usize, f: impl FnOnce(&mut CellStep)) {
        self.steps.update(|s| {
            if let Some(s) = s.get_mut(i) {
                f(s);
            }
        });
    }

    /// The numbers around the statements of this run.
    pub fn numbers(&self) -> Numbers {
        Numbers {
            start: self.start.get(),
            steps: self.steps.get(),
        }
    }
}

fn fresh(s: cell::Step) -> CellStep {
    CellStep {
        lines: s.lines,
        source: s.source,
        commands: s.commands,
        state: StepState::Waiting,
        after: None,
        pending: 0,
    }
}

/// A run's numbers, for judging the advice's claims.
pub struct Numbers {
    start: Option<Stats>,
    steps: Vec<CellStep>,
}

impl Numbers {
    /// The numbers after statement `i` (a statement without commands
    /// leaves them as they were).
    fn after(&self, i: usize) -> Option<Stats> {
        if self.steps.get(i)?.state != StepState::Done {
            return None;
        }
        self.steps[..=i]
            .iter()
            .rev()
            .find_map(|s| s.after.clone())
            .or_else(|| self.start.clone())
    }

    fn before(&self, i: usize) -> Option<Stats> {
        match i {
            0 => self.start.clone(),
            i => self.after(i - 1),
        }
    }
}

impl Run for Numbers {
    fn around(&self, at: &str) -> Option<(Stats, Stats)> {
        let i = self.steps.iter().position(|s| s.source.contains(at))?;
        Some((self.before(i)?, self.after(i)?))
    }
}

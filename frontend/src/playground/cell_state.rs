//! The code cell's state: its text, its top-level statements as CPython
//! runs them (Pyodide in a worker of its own, `python-worker`), which have
//! run, what each printed, and the numbers after each (the popular
//! advice's claims are judged on them). The worker's engine answers the
//! code at once; the lines it ran go to the session, paced, and the
//! session's results are the numbers the page shows.

use crate::playground::explanation::Explanation;
use leptos::prelude::*;
use std::collections::VecDeque;
use vramlab_shared::advice::Run;
use vramlab_shared::command::{parse_line, Command, CommandLine, RestartSettings};
use vramlab_shared::explain;
use vramlab_shared::protocol::{StatementView, StepRecord};
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
    pub state: StepState,
    /// What it printed.
    pub output: String,
    /// What it wrote to standard error (vramlab's notes, warnings).
    pub errors: String,
    /// The numbers before its first command and after its last.
    pub before: Option<Stats>,
    pub after: Option<Stats>,
    /// Its commands by name, in the order they first ran, with how many.
    commands: Vec<(String, usize)>,
    /// What its last command did.
    last: Option<Explanation>,
    pending: usize,
    /// Python finished it (its commands may still be on their way).
    ended: bool,
}

#[derive(Clone, Copy)]
pub struct CellState {
    pub source: RwSignal<String>,
    pub steps: RwSignal<Vec<CellStep>>,
    /// The statement a step runs next.
    pub next: RwSignal<usize>,
    /// A syntax error, or why nothing ran.
    pub error: RwSignal<Option<String>>,
    /// Python loading, or busy: what it is doing.
    pub busy: RwSignal<Option<String>>,
    /// What loading Python took (its version, bytes and time).
    pub python: RwSignal<Option<String>>,
    /// The statement whose explanation shows (the last one answered, or
    /// the one clicked).
    pub selected: RwSignal<Option<usize>>,
    /// The advice loaded (an index into `ADVICE`).
    pub advice: RwSignal<Option<usize>>,
    /// The numbers after the restart that starts a run.
    start: RwSignal<Option<Stats>>,
    /// Which statement each command sent belongs to (`None`: the restart),
    /// by the command's id.
    ids: RwSignal<Vec<(u64, Option<usize>)>>,
    /// Lines Python ran, waiting to go to the session.
    queue: StoredValue<VecDeque<(usize, String)>>,
    /// The statement Python is running.
    running: StoredValue<usize>,
    /// ❚❚ pause stopped the run: the next step starts a new one.
    stopped: StoredValue<bool>,
    /// Python's messages belong to this run: false from `forget` until the
    /// next run's statements come (what an earlier run still says, the
    /// worker says first, and it is not this run's).
    current: StoredValue<bool>,
}

impl CellState {
    pub fn new() -> Self {
        CellState {
            source: RwSignal::new(String::new()),
            steps: RwSignal::new(Vec::new()),
            next: RwSignal::new(0),
            error: RwSignal::new(None),
            busy: RwSignal::new(None),
            python: RwSignal::new(None),
            selected: RwSignal::new(None),
            advice: RwSignal::new(None),
            start: RwSignal::new(None),
            ids: RwSignal::new(Vec::new()),
            queue: StoredValue::new(VecDeque::new()),
            running: StoredValue::new(0),
            stopped: StoredValue::new(false),
            current: StoredValue::new(false),
        }
    }

    /// Forgets the last run (the text changed, or a run starts).
    pub fn forget(&self) {
        self.next.set(0);
        self.start.set(None);
        self.ids.set(Vec::new());
        self.steps.set(Vec::new());
        self.selected.set(None);
        self.error.set(None);
        self.queue.update_value(VecDeque::clear);
        self.stopped.set_value(false);
        self.current.set_value(false);
    }

    /// Whether the next step starts a run (nothing has run since the text changed).
    pub fn at_start(&self) -> bool {
        self.stopped.get_value()
            || (self.next.get_untracked() == 0 && self.steps.with_untracked(Vec::is_empty))
    }

    /// ❚❚ pause: the lines not yet sent are dropped; the first statement
    /// the session has not finished raises `KeyboardInterrupt` there, and
    /// those after it did not run. Whether a run was going.
    pub fn interrupt(&self) -> bool {
        let dropped = self
            .queue
            .try_update_value(std::mem::take)
            .unwrap_or_default();
        let Some(at) = self.steps.with_untracked(|s| {
            s.iter()
                .position(|s| s.state == StepState::Running || s.pending > 0)
        }) else {
            return false;
        };
        self.stopped.set_value(true);
        self.busy.set(None);
        self.steps.update(|steps| {
            for (i, s) in steps.iter_mut().enumerate().skip(at) {
                match i == at {
                    true => {
                        s.state = StepState::Failed(format!(
                            "KeyboardInterrupt: ❚❚ pause stopped it here ({} of its commands were not sent); ▶ Run all starts again",
                            dropped.iter().filter(|(step, _)| *step == i).count()
                        ))
                    }
                    false => {
                        s.state = StepState::Waiting;
                        s.output.clear();
                        s.errors.clear();
                    }
                }
            }
        });
        true
    }

    /// Python read the code: its statements, by their lines.
    pub fn statements(&self, spans: &[(usize, usize)]) {
        let text = self.source.get_untracked();
        let lines: Vec<&str> = text.lines().collect();
        let steps = spans
            .iter()
            .map(|&(a, b)| CellStep {
                lines: (a, b),
                source: lines
                    .get(a.saturating_sub(1)..b.min(lines.len()))
                    .map(|l| l.join("\n"))
                    .unwrap_or_default(),
                state: StepState::Waiting,
                output: String::new(),
                errors: String::new(),
                before: None,
                after: None,
                commands: Vec::new(),
                last: None,
                pending: 0,
                ended: false,
            })
            .collect();
        self.steps.set(steps);
        self.current.set_value(true);
    }

    pub fn begin(&self, i: usize) {
        if !self.current.get_value() {
            return;
        }
        self.running.set_value(i);
        self.update(i, |s| s.state = StepState::Running);
    }

    pub fn print(&self, text: &str, stderr: bool) {
        if !self.current.get_value() {
            return;
        }
        let i = self.running.get_value();
        self.update(i, |s| match stderr {
            true => s.errors.push_str(text),
            false => s.output.push_str(text),
        });
    }

    pub fn end(&self, i: usize, error: Option<String>) {
        if !self.current.get_value() {
            return;
        }
        self.update(i, |s| {
            s.ended = true;
            match error {
                Some(e) => s.state = StepState::Failed(e),
                None if s.pending == 0 => s.state = StepState::Done,
                None => {}
            }
        });
    }

    /// A line Python ran, for the session.
    pub fn queue_line(&self, line: String) {
        if !self.current.get_value() {
            return;
        }
        let i = self.running.get_value();
        self.update(i, |s| s.pending += 1);
        self.queue.update_value(|q| q.push_back((i, line)));
    }

    /// The next line for the session.
    pub fn next_line(&self) -> Option<(usize, CommandLine)> {
        let (i, line) = self.queue.try_update_value(VecDeque::pop_front).flatten()?;
        Some((i, parse_line(&line)))
    }

    pub fn queued(&self) -> usize {
        self.queue.with_value(VecDeque::len)
    }

    /// A command of statement `step` (or the run's restart) was sent as `id`.
    pub fn sent(&self, step: Option<usize>, id: u64) {
        self.ids.update(|m| m.push((id, step)));
    }

    /// The statement command `id` belongs to (`Some(None)`: the run's
    /// restart), forgotten once answered; `None` if the run sent no such command.
    fn take(&self, id: u64) -> Option<Option<usize>> {
        self.ids
            .try_update(|m| {
                let at = m.iter().position(|(sent, _)| *sent == id)?;
                Some(m.swap_remove(at).1)
            })
            .flatten()
    }

    /// A result came, from the numbers `before` it, with what it `said`:
    /// the statement it belongs to takes its numbers. Which statement.
    pub fn on_result(
        &self,
        id: u64,
        record: &StepRecord,
        before: &Stats,
        said: Option<Explanation>,
    ) -> Option<usize> {
        let step = self.take(id)?;
        let Some(i) = step else {
            self.start.set(Some(record.stats.clone()));
            return None;
        };
        let name = record.cmd.get("cmd").and_then(|c| c.as_str());
        self.update(i, |s| {
            s.before.get_or_insert_with(|| before.clone());
            s.after = Some(record.stats.clone());
            match s
                .commands
                .iter_mut()
                .find(|(n, _)| Some(n.as_str()) == name)
            {
                Some((_, count)) => *count += 1,
                None => s.commands.push((name.unwrap_or("?").to_string(), 1)),
            }
            s.last = said.or(s.last.take());
            s.pending = s.pending.saturating_sub(1);
            if s.pending == 0 && s.ended && s.state == StepState::Running {
                s.state = StepState::Done;
            }
        });
        Some(i)
    }

    /// Statement `i` explained: the numbers before and after it, and what
    /// moved them (its one command's words, or a count of its commands
    /// and the last one's words).
    pub fn explanation(&self, i: usize) -> Option<(Stats, Stats, Explanation)> {
        self.steps.with_untracked(|steps| {
            let s = steps.get(i)?;
            let (before, after, last) = (s.before.clone()?, s.after.clone()?, s.last.clone()?);
            let total: usize = s.commands.iter().map(|(_, n)| n).sum();
            let why = match total {
                1 => last.why.clone(),
                _ => format!(
                    "This statement ran {total} commands ({}). The last: {}",
                    s.commands
                        .iter()
                        .map(|(name, n)| format!("{name} ×{n}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    last.why
                ),
            };
            let said = Explanation {
                moved: explain::moved(&before, &after),
                why,
                link: last.link.clone(),
                ok: last.ok && !matches!(s.state, StepState::Failed(_)),
            };
            Some((before, after, said))
        })
    }

    /// The session refused a command of the run (the server's limits, a
    /// connection lost): the statement fails with the reason, and the
    /// lines after it are not sent (the session no longer follows the code).
    pub fn on_error(&self, id: u64, why: &str) {
        let Some(step) = self.take(id) else {
            return;
        };
        self.queue.update_value(VecDeque::clear);
        let i = step.unwrap_or(0);
        self.update(i, |s| {
            s.state = StepState::Failed(format!(
                "The session refused this statement's command: {why}"
            ))
        });
    }

    /// The presenter's statements, on a watcher's page.
    pub fn mirror(&self, statements: &[StatementView]) {
        let text = self.source.get_untracked();
        let lines: Vec<&str> = text.lines().collect();
        let steps = statements
            .iter()
            .map(|v| CellStep {
                lines: v.lines,
                source: lines
                    .get(v.lines.0.saturating_sub(1)..v.lines.1.min(lines.len()))
                    .map(|l| l.join("\n"))
                    .unwrap_or_default(),
                state: match v.state.as_str() {
                    "running" => StepState::Running,
                    "done" => StepState::Done,
                    "failed" => StepState::Failed(v.why.clone()),
                    _ => StepState::Waiting,
                },
                output: v.output.clone(),
                errors: v.errors.clone(),
                before: None,
                after: v.allocated.map(|allocated_bytes| Stats {
                    allocated_bytes,
                    ..Default::default()
                }),
                commands: Vec::new(),
                last: None,
                pending: 0,
                ended: true,
            })
            .collect();
        self.steps.set(steps);
    }

    /// The statements as a watcher is sent them (the newest 200, each
    /// one's last 2,000 characters of output).
    pub fn view(&self) -> Vec<StatementView> {
        const STATEMENTS: usize = 200;
        const OUTPUT: usize = 2000;
        let tail = |s: &str| {
            let at = s.len().saturating_sub(OUTPUT);
            let at = (at..=s.len())
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(s.len());
            s[at..].to_string()
        };
        self.steps.with_untracked(|steps| {
            steps[steps.len().saturating_sub(STATEMENTS)..]
                .iter()
                .map(|s| {
                    let (state, why) = match &s.state {
                        StepState::Waiting => ("waiting", ""),
                        StepState::Running => ("running", ""),
                        StepState::Done => ("done", ""),
                        StepState::Failed(why) => ("failed", why.as_str()),
                    };
                    StatementView {
                        lines: s.lines,
                        state: state.into(),
                        output: tail(&s.output),
                        errors: tail(&s.errors),
                        why: tail(why),
                        allocated: s.after.as_ref().map(|a| a.allocated_bytes),
                    }
                })
                .collect()
        })
    }

    /// A button's line joins the cell as a statement that has run.
    /// Puts `code` in the cell in place of what was there (a lesson as
    /// Python), ready for ▶ Run all.
    pub fn show_code(&self, code: String) {
        self.advice.set(None);
        self.source.set(code);
        self.forget();
    }

    /// Appends the line a control's command stands for, fitted to the
    /// cell (its imports when it has none, the names it adds to), so
    /// ▶ Run all runs it again.
    pub fn record_command(&self, command: &Command, framework: Framework) {
        let code = self
            .source
            .with_untracked(|s| vramlab_shared::python::append_to_cell(s, command, framework));
        self.record(&code);
    }

    fn record(&self, code: &str) {
        self.source.update(|s| {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            s.push_str(code);
            s.push('\n');
        });
        self.forget();
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

/// The restart that starts a run, on the session.
pub fn restart(framework: Framework) -> CommandLine {
    CommandLine::from(Command::Restart(RestartSettings {
        framework: Some(framework),
        ..Default::default()
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of three statements: Python has ended the first two, whose
    /// lines were sent as commands 1 and 2 (and 3, not yet sent, waits).
    fn a_run() -> CellState {
        let cell = CellState::new();
        cell.source.set("x = a()\ny = b()\nz = c()\n".into());
        cell.statements(&[(1, 1), (2, 2), (3, 3)]);
        for i in 0..2 {
            cell.begin(i);
            cell.queue_line(format!("{{\"cmd\":\"gc\",\"n\":{i}}}"));
            let (step, _) = cell.next_line().unwrap();
            cell.sent(Some(step), i as u64 + 1);
            cell.end(i, None);
        }
        cell.begin(2);
        cell.queue_line("{\"cmd\":\"gc\"}".into());
        cell
    }

    /// A record as the engine gives one.
    fn record() -> StepRecord {
        let mut engine = vramlab_shared::Engine::new(
            Box::new(vramlab_shared::engine::SimDeviceFactory),
            Default::default(),
        )
        .unwrap();
        engine.run_line(r#"{"cmd":"gc"}"#)
    }

    fn states(cell: &CellState) -> Vec<StepState> {
        cell.steps
            .get_untracked()
            .into_iter()
            .map(|s| s.state)
            .collect()
    }

    #[test]
    fn a_statement_is_done_when_its_commands_are_answered() {
        let cell = a_run();
        assert_eq!(states(&cell)[0], StepState::Running);
        cell.on_result(1, &record(), &Stats::default(), None);
        assert_eq!(states(&cell)[0], StepState::Done);
        assert_eq!(states(&cell)[1], StepState::Running);
    }

    fn said(why: &str) -> Option<Explanation> {
        Some(Explanation {
            moved: String::new(),
            why: why.into(),
            link: Default::default(),
            ok: true,
        })
    }

    fn allocated(bytes: u64) -> Stats {
        Stats {
            allocated_bytes: bytes,
            ..Default::default()
        }
    }

    /// A statement is explained from the numbers before its first command
    /// to those after its last, whatever was in flight: its heading and
    /// its words say the same thing.
    #[test]
    fn a_statement_is_explained_from_before_its_first_command_to_after_its_last() {
        let cell = a_run();
        cell.on_result(1, &record(), &allocated(2 << 20), said("one"));
        let (before, _, e) = cell.explanation(0).unwrap();
        assert_eq!(before.allocated_bytes, 2 << 20);
        assert_eq!(e.why, "one");
        assert!(
            e.moved.starts_with("Allocated fell by 2.00 MiB"),
            "{}",
            e.moved
        );
        // Statement 2 sends two more commands (its loop): three in all.
        cell.queue_line("{\"cmd\":\"gc\"}".into());
        let (step, _) = cell.next_line().unwrap();
        assert_eq!(step, 2);
        cell.sent(Some(2), 4);
        cell.queue_line("{\"cmd\":\"gc\"}".into());
        let (step, _) = cell.next_line().unwrap();
        cell.sent(Some(step), 5);
        cell.on_result(4, &record(), &allocated(3 << 20), said("first"));
        cell.on_result(5, &record(), &allocated(2 << 20), said("last"));
        let (before, _, e) = cell.explanation(2).unwrap();
        assert_eq!(before.allocated_bytes, 3 << 20);
        assert_eq!(
            e.why,
            "This statement ran 2 commands (gc ×2). The last: last"
        );
        assert!(
            e.moved.starts_with("Allocated fell by 3.00 MiB"),
            "{}",
            e.moved
        );
        // Statement 1's command is not answered yet: nothing to explain.
        assert!(cell.explanation(1).is_none());
    }

    #[test]
    fn a_refused_command_fails_its_statement_and_sends_nothing_more() {
        let cell = a_run();
        cell.on_error(2, "more than 50 commands a second");
        let StepState::Failed(why) = &states(&cell)[1] else {
            panic!("{:?}", states(&cell))
        };
        assert!(why.contains("more than 50 commands a second"), "{why}");
        assert_eq!(cell.queued(), 0);
        // A command the run did not send is not its business.
        cell.on_error(99, "?");
        assert_eq!(states(&cell)[0], StepState::Running);
    }

    #[test]
    fn pause_raises_keyboard_interrupt_where_the_session_is() {
        let cell = a_run();
        cell.on_result(1, &record(), &Stats::default(), None);
        assert!(cell.interrupt());
        let s = states(&cell);
        assert_eq!(s[0], StepState::Done);
        let StepState::Failed(why) = &s[1] else {
            panic!("{s:?}")
        };
        assert!(why.starts_with("KeyboardInterrupt"), "{why}");
        assert_eq!(s[2], StepState::Waiting);
        assert_eq!(cell.queued(), 0);
        // The next step starts a new run; nothing is left to interrupt.
        assert!(cell.at_start());
        cell.forget();
        assert!(!cell.interrupt());
    }

    /// The text changed (or a button wrote its line) while Python ran: what
    /// the old run still says is not the new run's, and none of its lines
    /// go to the session; the new run's statements start the new run.
    #[test]
    fn an_earlier_runs_last_words_are_not_this_runs() {
        let cell = a_run();
        cell.record("gc.collect()");
        cell.begin(2);
        cell.print("late\n", false);
        cell.queue_line("{\"cmd\":\"gc\"}".into());
        cell.end(2, None);
        assert_eq!(cell.queued(), 0);
        assert!(cell.steps.get_untracked().is_empty());
        cell.statements(&[(1, 1)]);
        cell.begin(0);
        cell.queue_line("{\"cmd\":\"gc\"}".into());
        assert_eq!(cell.queued(), 1);
    }
}

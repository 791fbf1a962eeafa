//! The playground's state: what the server said, what the user did, and
//! what the views draw. Every incoming message goes through [`App::handle`].

use crate::files;
use crate::history::{self, Point};
use crate::lessons::LESSONS;
use crate::replay::Replays;
use crate::socket;
use leptos::prelude::*;
use std::collections::{HashMap, VecDeque};
use vramlab_shared::command::{parse_line, Command, CommandLine, RestartSettings};
use vramlab_shared::framework::oom_exception;
use vramlab_shared::lesson::check_step;
use vramlab_shared::lesson::predict::{self, Direction, Number};
use vramlab_shared::protocol::local;
use vramlab_shared::protocol::{
    ClientMessage, ConnectionErrorKind, Hello, Role, ServerMessage, StepRecord,
};
use vramlab_shared::snapshot::{apply, Event, Snapshot, Stats};
use vramlab_shared::torch_snapshot::{self, MemorySnapshot};
use vramlab_shared::types::Framework;
use vramlab_shared::ErrorKind;
use vramlab_shared::{explain, python};

#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    Connecting,
    /// Connected to the server.
    Open,
    /// The engine runs in this page; `fallback`: because no server answered.
    Page {
        fallback: bool,
    },
    Closed(String),
}

impl Status {
    /// Commands can go out: to the server, or to the engine in the page.
    pub fn is_ready(&self) -> bool {
        matches!(self, Status::Open | Status::Page { .. })
    }
}

/// The explanation shown after a command.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    pub moved: String,
    pub why: String,
    pub link: (String, String),
    pub ok: bool,
}

impl Explanation {
    /// The presenter's explanation, on a watcher's page.
    pub fn mirrored(e: vramlab_shared::protocol::ExplanationView) -> Self {
        Explanation {
            moved: e.moved,
            why: e.why,
            link: e.link,
            ok: e.ok,
        }
    }
}

/// A lesson being played.
#[derive(Clone, Debug, PartialEq)]
pub struct LessonRun {
    pub index: usize,
    pub step: usize,
    /// The outcome of the last checked step: passed, and the words.
    pub outcome: Option<(bool, String)>,
    /// The learner's prediction for the step about to run.
    pub guess: Option<Direction>,
    /// How the last prediction went: right, and the words.
    pub guessed: Option<(bool, String)>,
}

impl LessonRun {
    /// Step `step` of lesson `index`, nothing checked or guessed yet.
    pub fn at(index: usize, step: usize) -> Self {
        LessonRun {
            index,
            step,
            outcome: None,
            guess: None,
            guessed: None,
        }
    }
}

/// Where an exported session goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportTo {
    /// Opened in the snapshot panel.
    Panel,
    /// Saved as a pickle.
    Download,
}

struct Pending {
    command: Command,
    before: Stats,
}

#[derive(Clone, Copy)]
pub struct App {
    pub status: RwSignal<Status>,
    pub hello: RwSignal<Option<Hello>>,
    /// The segments and objects, as of the last snapshot or delta.
    pub snapshot: RwSignal<Option<Snapshot>>,
    /// The numbers now: from the last snapshot, delta or result (a result
    /// comes before its delta, and its numbers need not wait for the map).
    pub stats: RwSignal<Option<Stats>>,
    pub history: RwSignal<Vec<Point>>,
    pub events: RwSignal<VecDeque<Event>>,
    pub code: RwSignal<Vec<String>>,
    pub explanation: RwSignal<Option<Explanation>>,
    pub banner: RwSignal<Option<String>>,
    pub selected: RwSignal<String>,
    pub lesson: RwSignal<Option<LessonRun>>,
    pub progress: RwSignal<Option<(u64, u64)>>,
    pub last_step: RwSignal<Option<u64>>,
    /// Results received (a change marker for tests and screen readers).
    pub results: RwSignal<u64>,
    pub hidden: RwSignal<Vec<String>>,
    pub draw_ms: RwSignal<f64>,
    next_id: RwSignal<u64>,
    pending: RwSignal<HashMap<u64, Pending>>,
    /// Framework asked for in the URL, applied on the first connection.
    pub wanted_framework: RwSignal<Option<Framework>>,
    /// The presenter's page, on a watcher's (`mirror` shows it).
    pub presented: RwSignal<Option<vramlab_shared::protocol::PresenterView>>,
    /// Edits of the controls (a change marker for mirroring them).
    pub control_edits: RwSignal<u64>,
    /// Projector mode: large type, dark, high contrast.
    pub projector: RwSignal<bool>,
    /// The numbers the last result moved (drawn highlighted).
    pub moved: RwSignal<Vec<Number>>,
    /// Who watches the session now.
    pub watchers: RwSignal<Vec<String>>,
    /// The code cell.
    pub cell: crate::cell::CellState,
    /// ▶ play: training a step at a time.
    pub play: crate::play::Play,
    /// A snapshot file opened in the page.
    pub replays: Replays,
    export_to: RwSignal<Option<ExportTo>>,
    /// Whether a hello came since the page loaded.
    greeted: RwSignal<bool>,
    /// Replaying the page's own session on the server.
    moving: RwSignal<crate::moving::Move>,
}

const MAX_EVENTS: usize = 200;

impl App {
    /// Writes the framework, lesson step and hidden groups into the URL.
    pub fn save_url(&self) {
        crate::url::save(
            self.hello.get_untracked().map(|h| h.framework),
            self.lesson.get_untracked().map(|l| (l.index, l.step)),
            &self.hidden.get_untracked(),
            self.projector.get_untracked(),
        );
    }

    pub fn new() -> Self {
        Self {
            status: RwSignal::new(Status::Connecting),
            hello: RwSignal::new(None),
            snapshot: RwSignal::new(None),
            stats: RwSignal::new(None),
            history: RwSignal::new(Vec::new()),
            events: RwSignal::new(VecDeque::new()),
            code: RwSignal::new(Vec::new()),
            explanation: RwSignal::new(None),
            banner: RwSignal::new(None),
            selected: RwSignal::new("x".into()),
            lesson: RwSignal::new(None),
            progress: RwSignal::new(None),
            last_step: RwSignal::new(None),
            results: RwSignal::new(0),
            hidden: RwSignal::new(Vec::new()),
            draw_ms: RwSignal::new(0.0),
            next_id: RwSignal::new(1),
            pending: RwSignal::new(HashMap::new()),
            wanted_framework: RwSignal::new(None),
            watchers: RwSignal::new(Vec::new()),
            moved: RwSignal::new(Vec::new()),
            projector: RwSignal::new(false),
            control_edits: RwSignal::new(0),
            presented: RwSignal::new(None),
            cell: crate::cell::CellState::new(),
            play: crate::play::Play::new(),
            replays: Replays::new(),
            export_to: RwSignal::new(None),
            greeted: RwSignal::new(false),
            moving: RwSignal::new(Default::default()),
        }
    }

    /// Asks the server for this session as a memory snapshot.
    pub fn export(&self, to: ExportTo) {
        self.export_to.set(Some(to));
        socket::send(&ClientMessage::ExportSnapshot {});
    }

    fn on_export(&self, snapshot: &MemorySnapshot) {
        let name = "vramlab-session.pickle";
        let bytes = torch_snapshot::write_pickle(snapshot);
        match self.export_to.get_untracked() {
            Some(ExportTo::Panel) => self.replays.open(name.into(), &bytes),
            Some(ExportTo::Download) => {
                if let Err(why) = files::download(name, &bytes, "application/octet-stream") {
                    self.banner.set(Some(why));
                }
            }
            None => {}
        }
        self.export_to.set(None);
    }

    pub fn framework(&self) -> Framework {
        self.hello
            .with_untracked(|h| h.as_ref().map(|h| h.framework))
            .unwrap_or(Framework::Pytorch)
    }

    /// The kernel's framework, tracked (for views that follow it).
    pub fn framework_now(&self) -> Framework {
        self.hello
            .with(|h| h.as_ref().map(|h| h.framework))
            .unwrap_or(Framework::Pytorch)
    }

    pub fn read_only(&self) -> bool {
        self.hello
            .with(|h| h.as_ref().is_some_and(|h| h.role == Role::Watcher))
    }

    pub fn stats(&self) -> Option<Stats> {
        self.stats.get()
    }

    /// Runs a command built by a control; its line joins the code cell.
    pub fn run(&self, command: Command) {
        if !matches!(command, Command::Restart(_)) {
            self.cell.record(&python::code(&command, self.framework()));
        }
        self.submit(CommandLine::from(command));
    }

    /// Sends a parsed line (a lesson step keeps its annotations here);
    /// returns its id, or nothing when the line is not a command.
    pub fn submit(&self, line: CommandLine) -> Option<u64> {
        if let Ok(command) = &line.command {
            let code = python::code(command, self.framework());
            self.code.update(|c| c.push(code));
        }
        self.submit_quietly(line)
    }

    /// Sends a parsed line without writing it into the Python pane.
    pub fn submit_quietly(&self, line: CommandLine) -> Option<u64> {
        let command = line.command.clone().ok()?;
        let id = self.next_id.get_untracked();
        self.next_id.set(id + 1);
        if socket::is_page() {
            crate::moving::ran(id, &line);
        }
        let before = self.stats.get_untracked().unwrap_or_default();
        self.pending
            .update(|p| _ = p.insert(id, Pending { command, before }));
        socket::send(&ClientMessage::Command {
            id,
            command: Box::new(line),
        });
        Some(id)
    }

    /// The commands sent and not yet answered.
    pub fn pending_ids(&self) -> Vec<u64> {
        self.pending.with_untracked(|p| p.keys().copied().collect())
    }

    /// On the server's hello: replays the lines a move brought, if any.
    fn start_move(&self) -> bool {
        let left: VecDeque<CommandLine> = crate::moving::take().into();
        if left.is_empty() {
            return false;
        }
        let total = left.len();
        self.moving.set(crate::moving::Move {
            left,
            total,
            in_flight: None,
        });
        self.send_moved_line();
        true
    }

    fn send_moved_line(&self) {
        let Some(line) = self.moving.try_update(|m| m.left.pop_front()).flatten() else {
            return;
        };
        let id = self.submit_quietly(line);
        self.moving.update(|m| m.in_flight = id);
        self.banner
            .set(Some(self.moving.with_untracked(|m| m.words())));
        if id.is_none() {
            // A line that is not a command: nothing to wait for.
            self.after_moved_line();
        }
    }

    /// The next line after the server's pace allows (its commands a second).
    fn after_moved_line(&self) {
        self.moving.update(|m| m.in_flight = None);
        self.banner
            .set(Some(self.moving.with_untracked(|m| m.words())));
        if self.moving.with_untracked(|m| m.left.is_empty()) {
            return;
        }
        let app = *self;
        let wait = self.play.min_ms.get_untracked();
        set_timeout(
            move || app.send_moved_line(),
            std::time::Duration::from_millis(wait),
        );
    }

    fn push_events(&self, events: &[Event]) {
        self.events.update(|q| {
            q.extend(events.iter().cloned());
            while q.len() > MAX_EVENTS {
                q.pop_front();
            }
        });
    }

    /// One message from the server.
    pub fn handle(&self, text: &str) {
        let Ok(msg) = serde_json::from_str::<ServerMessage>(text) else {
            self.banner.set(Some(
                "The server sent something this page does not understand; reload it.".into(),
            ));
            return;
        };
        match msg {
            ServerMessage::Hello(h) => {
                // ▶ play never sends faster than the session's command rate.
                let rate = u64::from(h.limits.commands_per_second.max(1));
                self.play.min_ms.set(1000u64.div_ceil(rate));
                if h.role == Role::Owner && h.backend != local::BACKEND {
                    socket::remember_session(&h.session_id);
                }
                let fresh_kernel = !h.resumed;
                let page_loaded = !self.greeted.get_untracked();
                self.greeted.set(true);
                self.hello.set(Some(*h));
                self.banner.set(None);
                let owner = !self.read_only();
                if owner && fresh_kernel && self.start_move() {
                    // The moved session brings its own lesson and framework.
                } else if owner && self.lesson_step() > 0 && (page_loaded || fresh_kernel) {
                    self.catch_up_lesson();
                } else if owner && page_loaded {
                    self.apply_wanted_framework();
                }
            }
            ServerMessage::Snapshot { snapshot } => {
                self.events.set(snapshot.events.iter().cloned().collect());
                let s = *snapshot;
                let point = Point::new(&s.stats, s.stats.allocated_bytes, None);
                self.history.update(|h| history::push_sample(h, point));
                self.stats.set(Some(s.stats.clone()));
                self.snapshot.set(Some(s));
            }
            ServerMessage::Delta(delta) => {
                let point = Point::new(&delta.stats, delta.peak_allocated_bytes, None);
                self.history.update(|h| history::push_sample(h, point));
                self.stats.set(Some(delta.stats.clone()));
                self.snapshot.update(|s| {
                    if let Some(s) = s {
                        apply(s, &delta);
                    }
                });
            }
            ServerMessage::Events { events, .. } => self.push_events(&events),
            ServerMessage::Progress { done, total, .. } => self.progress.set(Some((done, total))),
            ServerMessage::Result { id, record } => self.on_result(id, *record),
            ServerMessage::Error { id, error } => {
                if let Some(id) = id {
                    self.pending.update(|p| {
                        p.remove(&id);
                    });
                    self.play.on_error(id, &error.message);
                }
                if error.kind == ConnectionErrorKind::UnknownSession {
                    socket::forget_session();
                }
                self.banner.set(Some(error.message));
            }
            ServerMessage::MemorySnapshot { snapshot } => self.on_export(&snapshot),
            ServerMessage::Watchers { watchers } => self.watchers.set(watchers),
            ServerMessage::Presenter { view } => {
                if self.read_only() {
                    self.presented.set(Some(*view));
                }
            }
            ServerMessage::Pong { .. } => {}
        }
    }

    fn on_result(&self, id: u64, record: StepRecord) {
        self.progress.set(None);
        // The result's stats are the state after the command; the segment
        // map and the tables follow with the next delta.
        self.stats.set(Some(record.stats.clone()));
        self.last_step.set(Some(record.step));
        self.results.update(|n| *n += 1);
        let pending = self.pending.try_update(|p| p.remove(&id)).flatten();
        self.cell.on_result(id, &record);
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
        self.history
            .update(|h| history::push_result(h, point, restart));
        self.follow_restart(&record);
        if let Some(p) = &pending {
            let why = match &record.error {
                Some(e) => e.message.clone(),
                None => record.note.clone().unwrap_or_default(),
            };
            self.explanation.set(Some(Explanation {
                moved: explain::moved(&p.before, &record.stats),
                why,
                link: {
                    let (title, url) = explain::fact_link(&p.command, self.framework());
                    (title.into(), url.into())
                },
                ok: record.ok,
            }));
            self.moved.set(
                [Number::Allocated, Number::Reserved, Number::NvidiaSmi]
                    .into_iter()
                    .filter(|n| n.of(&p.before) != n.of(&record.stats))
                    .collect(),
            );
            self.check_lesson(p, &record);
        }
        match &record.error {
            Some(e) if e.kind == ErrorKind::OutOfMemory => {
                let exception = oom_exception(self.framework());
                self.banner.set(Some(format!("{exception}: {}", e.message)));
            }
            Some(e) => self.banner.set(Some(e.message.clone())),
            None => self.banner.set(None),
        }
        if self.moving.with_untracked(|m| m.in_flight == Some(id)) {
            self.after_moved_line();
        }
    }

    /// A restart may change the framework and settings: the hello came
    /// before it, so take what the result says (owners and watchers alike).
    fn follow_restart(&self, record: &StepRecord) {
        let Some(settings) = &record.settings else {
            return;
        };
        self.hello.update(|h| {
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

    /// The step the lesson being played is at (0 with none).
    fn lesson_step(&self) -> usize {
        self.lesson
            .with_untracked(|l| l.as_ref().map_or(0, |l| l.step))
    }

    /// A link to step N of a lesson (or a kernel that lost its state while
    /// the lesson was at step N): the steps before it run again, from the
    /// lesson's own restart, so the kernel is where the step expects it.
    fn catch_up_lesson(&self) {
        let Some(run) = self.lesson.get_untracked() else {
            return;
        };
        self.lesson.set(Some(LessonRun::at(run.index, 0)));
        for step in 0..run.step {
            if let Some(line) = Self::lesson_line(run.index, step) {
                self.submit(line);
            }
        }
    }

    /// `?framework=` in the link: a kernel of that framework.
    fn apply_wanted_framework(&self) {
        if let Some(f) = self.wanted_framework.get_untracked() {
            if f != self.framework() {
                self.run(Command::Restart(RestartSettings {
                    framework: Some(f),
                    ..Default::default()
                }));
            }
        }
    }

    /// A lesson step's line, annotations split off.
    pub fn lesson_line(index: usize, step: usize) -> Option<CommandLine> {
        let line = LESSONS.get(index)?.lines().get(step).copied()?;
        Some(parse_line(line))
    }

    fn check_lesson(&self, sent: &Pending, record: &StepRecord) {
        let Some(run) = self.lesson.get_untracked() else {
            return;
        };
        let Some(parsed) = Self::lesson_line(run.index, run.step) else {
            return;
        };
        if parsed.command.as_ref() != Ok(&sent.command) {
            // A restart the lesson did not ask for empties the kernel the
            // lesson stands on: it starts again from its first step.
            if matches!(sent.command, Command::Restart(_)) && run.step > 0 {
                self.lesson.set(Some(LessonRun {
                    outcome: Some((
                        false,
                        "The kernel restarted: the lesson starts again from its first step.".into(),
                    )),
                    ..LessonRun::at(run.index, 0)
                }));
                self.save_url();
            }
            return;
        }
        let expect = parsed.annotations.expect.unwrap_or_default();
        let guessed = run.guess.and_then(|guess| {
            let number = predict::number_to_predict(&expect, &sent.before)?;
            Some(predict::verdict(number, guess, &sent.before, &record.stats))
        });
        let mismatches = check_step(&expect.into_iter().collect(), record);
        // A step with no words of its own says what the engine said.
        let why = parsed
            .annotations
            .why
            .or_else(|| record.note.clone())
            .unwrap_or_default();
        let outcome = if mismatches.is_empty() {
            (true, why)
        } else {
            let what: Vec<String> = mismatches
                .iter()
                .map(|m| {
                    format!(
                        "{} was {} (the lesson expects {})",
                        m.key, m.actual, m.expected
                    )
                })
                .collect();
            (false, format!("{} {why}", what.join("; ")))
        };
        self.lesson.set(Some(LessonRun {
            outcome: Some(outcome),
            guessed,
            ..LessonRun::at(run.index, run.step + 1)
        }));
        self.save_url();
    }
}

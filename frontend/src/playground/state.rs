//! The playground's state: what the server said, what the user did, and
//! what the views draw. Every incoming message goes through [`App::handle`],
//! which routes it; each concern is a module of its own: a command's result
//! (`result`), the lesson being played (`lesson`), a session moved from the
//! page to the server (`moving`), the session exported as a snapshot
//! (`export`).

use crate::playground::history::{self, Point};
use crate::playground::socket;
use leptos::prelude::*;
use std::collections::{HashMap, VecDeque};
use vramlab_shared::command::{Command, CommandLine};
use vramlab_shared::lesson::predict::Number;
use vramlab_shared::protocol::local;
use vramlab_shared::protocol::{ClientMessage, ConnectionErrorKind, Hello, Role, ServerMessage};
use vramlab_shared::python;
use vramlab_shared::snapshot::{apply, Event, Snapshot, Stats};
use vramlab_shared::types::Framework;

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

pub use crate::playground::explanation::Explanation;

pub(crate) struct Pending {
    command: Command,
    before: Stats,
}

/// The connection and who is on it.
#[derive(Clone, Copy)]
pub struct Link {
    pub status: RwSignal<Status>,
    pub hello: RwSignal<Option<Hello>>,
    /// Whether a hello came since the page loaded.
    greeted: RwSignal<bool>,
    /// Framework asked for in the URL, applied on the first connection.
    pub wanted_framework: RwSignal<Option<Framework>>,
    /// Who watches the session now.
    pub watchers: RwSignal<Vec<String>>,
    /// The presenter's page, on a watcher's (`mirror` shows it).
    pub presented: RwSignal<Option<vramlab_shared::protocol::PresenterView>>,
}

/// What the engine reports: the memory now and over the session.
#[derive(Clone, Copy)]
pub struct Memory {
    /// The segments and objects, as of the last snapshot or delta.
    pub snapshot: RwSignal<Option<Snapshot>>,
    /// The numbers now: from the last snapshot, delta or result (a result
    /// comes before its delta, and its numbers need not wait for the map).
    pub stats: RwSignal<Option<Stats>>,
    pub history: RwSignal<Vec<Point>>,
    pub events: RwSignal<VecDeque<Event>>,
    pub progress: RwSignal<Option<(u64, u64)>>,
    pub last_step: RwSignal<Option<u64>>,
    /// Results received (a change marker for tests and screen readers).
    pub results: RwSignal<u64>,
    /// The numbers after the last result: those before the next command
    /// (results come in order; several may be in flight).
    pub after_result: StoredValue<Option<Stats>>,
}

/// Commands sent and not yet answered, and the Python they stand for.
#[derive(Clone, Copy)]
pub struct Outbox {
    next_id: RwSignal<u64>,
    pending: RwSignal<HashMap<u64, Pending>>,
    /// The Python pane's lines.
    pub code: RwSignal<Vec<String>>,
}

/// The words around the numbers.
#[derive(Clone, Copy)]
pub struct Words {
    pub explanation: RwSignal<Option<Explanation>>,
    pub banner: RwSignal<Option<String>>,
    /// The numbers the last result moved (drawn highlighted).
    pub moved: RwSignal<Vec<Number>>,
}

/// How the page shows things.
#[derive(Clone, Copy)]
pub struct Display {
    /// The tensor the controls act on.
    pub selected: RwSignal<String>,
    pub hidden: RwSignal<Vec<String>>,
    /// Projector mode: large type, dark, high contrast.
    pub projector: RwSignal<bool>,
    /// Edits of the controls (a change marker for mirroring them).
    pub control_edits: RwSignal<u64>,
    pub draw_ms: RwSignal<f64>,
    /// Every block before the lesson step being run (its picture marks
    /// what changed); none after a catch-up.
    pub before_step: StoredValue<Option<Vec<vramlab_shared::snapshot::BlockSnapshot>>>,
}

/// The page's state, one store per concern.
#[derive(Clone, Copy)]
pub struct App {
    pub link: Link,
    pub memory: Memory,
    pub outbox: Outbox,
    pub words: Words,
    pub display: Display,
    pub lesson: RwSignal<Option<LessonRun>>,
    /// Lesson files fetched so far (a change marker).
    pub lesson_texts: RwSignal<u32>,
    /// The code cell.
    pub cell: crate::playground::cell_state::CellState,
    /// ▶ play: training a step at a time.
    pub play: crate::playground::play::Play,
    export_to: RwSignal<Option<ExportTo>>,
    /// Replaying the page's own session on the server.
    moving: RwSignal<crate::playground::to_server::Move>,
}

const MAX_EVENTS: usize = 200;

impl App {
    /// Writes the framework, lesson step and hidden groups into the URL.
    pub fn save_url(&self) {
        crate::playground::url::save(
            self.link.hello.get_untracked().map(|h| h.framework),
            self.lesson.get_untracked().map(|l| (l.index, l.step)),
            &self.display.hidden.get_untracked(),
            self.display.projector.get_untracked(),
        );
    }

    pub fn new() -> Self {
        let link = Link {
            status: RwSignal::new(Status::Connecting),
            hello: RwSignal::new(None),
            greeted: RwSignal::new(false),
            wanted_framework: RwSignal::new(None),
            watchers: RwSignal::new(Vec::new()),
            presented: RwSignal::new(None),
        };
        let memory = Memory {
            snapshot: RwSignal::new(None),
            stats: RwSignal::new(None),
            history: RwSignal::new(Vec::new()),
            events: RwSignal::new(VecDeque::new()),
            progress: RwSignal::new(None),
            last_step: RwSignal::new(None),
            results: RwSignal::new(0),
            after_result: StoredValue::new(None),
        };
        let display = Display {
            selected: RwSignal::new("x".into()),
            hidden: RwSignal::new(Vec::new()),
            projector: RwSignal::new(false),
            control_edits: RwSignal::new(0),
            draw_ms: RwSignal::new(0.0),
            before_step: StoredValue::new(None),
        };
        Self {
            link,
            memory,
            outbox: Outbox {
                next_id: RwSignal::new(1),
                pending: RwSignal::new(HashMap::new()),
                code: RwSignal::new(Vec::new()),
            },
            words: Words {
                explanation: RwSignal::new(None),
                banner: RwSignal::new(None),
                moved: RwSignal::new(Vec::new()),
            },
            display,
            lesson: RwSignal::new(None),
            lesson_texts: RwSignal::new(0),
            cell: crate::playground::cell_state::CellState::new(),
            play: crate::playground::play::Play::new(),
            export_to: RwSignal::new(None),
            moving: RwSignal::new(Default::default()),
        }
    }

    pub fn framework(&self) -> Framework {
        self.link
            .hello
            .with_untracked(|h| h.as_ref().map(|h| h.framework))
            .unwrap_or(Framework::Pytorch)
    }

    /// The kernel's framework, tracked (for views that follow it).
    pub fn framework_now(&self) -> Framework {
        self.link
            .hello
            .with(|h| h.as_ref().map(|h| h.framework))
            .unwrap_or(Framework::Pytorch)
    }

    pub fn read_only(&self) -> bool {
        self.link
            .hello
            .with(|h| h.as_ref().is_some_and(|h| h.role == Role::Watcher))
    }

    /// Runs a command built by a control; its line joins the code cell.
    pub fn run(&self, command: Command) {
        if !matches!(command, Command::Restart(_)) {
            self.cell.record_command(&command, self.framework());
        }
        self.submit(CommandLine::from(command));
    }

    /// Sends a parsed line (a lesson step keeps its annotations here);
    /// returns its id, or nothing when the line is not a command.
    pub fn submit(&self, line: CommandLine) -> Option<u64> {
        if let Ok(command) = &line.command {
            let framework = self.framework();
            self.outbox.code.update(|c| {
                let code = python::code_after(&c.join("\n"), command, framework);
                c.push(code);
            });
        }
        self.submit_quietly(line)
    }

    /// Sends a parsed line without writing it into the Python pane.
    pub fn submit_quietly(&self, line: CommandLine) -> Option<u64> {
        let command = line.command.clone().ok()?;
        let id = self.outbox.next_id.get_untracked();
        self.outbox.next_id.set(id + 1);
        self.pend(id, &line, command);
        socket::send(&ClientMessage::Command {
            id,
            command: Box::new(line),
        });
        Some(id)
    }

    /// Sends several parsed lines in one message (the cell's lines as
    /// Python ran them), each written into the Python pane; their ids, in
    /// order (none for a line that is not a command: it is not sent).
    pub fn submit_batch(&self, lines: Vec<CommandLine>) -> Vec<Option<u64>> {
        let first_id = self.outbox.next_id.get_untracked();
        let mut ids = Vec::with_capacity(lines.len());
        let mut sent = Vec::with_capacity(lines.len());
        for line in lines {
            let Ok(command) = line.command.clone() else {
                ids.push(None);
                continue;
            };
            let id = first_id + sent.len() as u64;
            let code = python::code(&command, self.framework());
            self.outbox.code.update(|c| c.push(code));
            self.pend(id, &line, command);
            ids.push(Some(id));
            sent.push(line);
        }
        if sent.is_empty() {
            return ids;
        }
        self.outbox.next_id.set(first_id + sent.len() as u64);
        socket::send(&ClientMessage::Commands {
            first_id,
            commands: sent,
        });
        ids
    }

    /// Command `id` goes out now: it waits for its result (and the page's
    /// engine keeps its line, for a move to the server).
    fn pend(&self, id: u64, line: &CommandLine, command: Command) {
        if socket::is_page() {
            crate::playground::to_server::ran(id, line);
        }
        let before = self.memory.stats.get_untracked().unwrap_or_default();
        self.outbox
            .pending
            .update(|p| _ = p.insert(id, Pending { command, before }));
    }

    /// The commands sent and not yet answered.
    pub fn pending_ids(&self) -> Vec<u64> {
        self.outbox
            .pending
            .with_untracked(|p| p.keys().copied().collect())
    }

    fn push_events(&self, events: &[Event]) {
        self.memory.events.update(|q| {
            q.extend(events.iter().cloned());
            while q.len() > MAX_EVENTS {
                q.pop_front();
            }
        });
    }

    /// One message from the server.
    pub fn handle(&self, text: &str) {
        let Ok(msg) = serde_json::from_str::<ServerMessage>(text) else {
            self.words.banner.set(Some(
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
                let page_loaded = !self.link.greeted.get_untracked();
                self.link.greeted.set(true);
                self.link.hello.set(Some(*h));
                self.words.banner.set(None);
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
                self.memory
                    .events
                    .set(snapshot.events.iter().cloned().collect());
                let s = *snapshot;
                let point = Point::new(&s.stats, s.stats.allocated_bytes, None);
                self.memory
                    .history
                    .update(|h| history::push_sample(h, point));
                self.memory.stats.set(Some(s.stats.clone()));
                self.memory.snapshot.set(Some(s));
            }
            ServerMessage::Delta(delta) => {
                // A live sample is a moment of a command not yet answered
                // (a delta is of the engine's step, one past its record's):
                // one that comes after its command's result, or a later
                // one's, is of the past and adds no point and no numbers
                // (it drew spikes: 0 -> 700 MiB -> 0 after `del big`).
                let answered = self.memory.last_step.get_untracked();
                if answered.is_none_or(|s| delta.step > s + 1) {
                    let point = Point::new(&delta.stats, delta.peak_allocated_bytes, None);
                    self.memory
                        .history
                        .update(|h| history::push_sample(h, point));
                    self.memory.stats.set(Some(delta.stats.clone()));
                }
                self.memory.snapshot.update(|s| {
                    if let Some(s) = s {
                        apply(s, &delta);
                    }
                });
            }
            ServerMessage::Events { events, .. } => self.push_events(&events),
            ServerMessage::Progress { done, total, .. } => {
                self.memory.progress.set(Some((done, total)))
            }
            ServerMessage::Result { id, record } => self.on_result(id, *record),
            ServerMessage::Error { id, error } => {
                if let Some(id) = id {
                    self.outbox.pending.update(|p| {
                        p.remove(&id);
                    });
                    self.play.on_error(id, &error.message);
                    self.cell.on_error(id, &error.message);
                }
                if error.kind == ConnectionErrorKind::UnknownSession {
                    socket::forget_session();
                }
                self.words.banner.set(Some(error.message));
            }
            ServerMessage::MemorySnapshot { snapshot } => self.on_export(&snapshot),
            ServerMessage::Watchers { watchers } => self.link.watchers.set(watchers),
            ServerMessage::Presenter { view } => {
                if self.read_only() {
                    self.link.presented.set(Some(*view));
                }
            }
            ServerMessage::Pong { .. } => {}
        }
    }
}

mod export;
mod lesson;
mod moving;
mod result;
pub use export::ExportTo;
pub use lesson::LessonRun;

//! The wire format on top of the engine: the result record of one command
//! (one line of `vramlab run` output) and the websocket's messages.

use crate::command::{parse_line, Command, CommandLine};
use crate::device::DeviceInfo;
use crate::engine::Engine;
use crate::error::CommandError;
use crate::framework::Settings;
use crate::snapshot::{Event, Snapshot, SnapshotDelta, Stats};
use crate::torch_snapshot::MemorySnapshot;
use crate::types::Framework;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

pub mod local;
pub mod python_worker;
mod read;
pub mod session;

/// A message table: each message's variant, its fields, its `"type"` and
/// the function that reads it, written once. It makes the enum (serde
/// writes it with that tag), `TYPES`, `type_name` and the reader by type,
/// so no message is declared without a reader or read without a
/// declaration.
macro_rules! messages {
    ($(#[$meta:meta])* pub enum $enum:ident {
        $($(#[$doc:meta])* $variant:ident $body:tt = $name:literal => $read:path,)*
    }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Serialize)]
        #[serde(tag = "type")]
        pub enum $enum {
            $($(#[$doc])* #[serde(rename = $name)] $variant $body,)*
        }

        impl $enum {
            /// Every message's `"type"`, in the table's order.
            pub const TYPES: &'static [&'static str] = &[$($name),*];

            /// This message's `"type"`.
            pub fn type_name(&self) -> &'static str {
                match self {
                    $(Self::$variant { .. } => $name,)*
                }
            }

            /// The message of type `kind` read from its other fields.
            fn read_fields(
                fields: crate::fields::Fields,
                kind: &str,
            ) -> Result<Self, serde_json::Error> {
                match kind {
                    $($name => $read(fields),)*
                    _ => Err(<serde_json::Error as serde::de::Error>::unknown_variant(
                        kind,
                        Self::TYPES,
                    )),
                }
            }
        }
    };
}

/// Version of the wire format; bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;
/// The most events a full snapshot carries.
pub const SNAPSHOT_EVENTS: usize = 2_000;
/// The most events one live batch carries (the rest are counted as dropped).
pub const LIVE_EVENT_BATCH: usize = 100;

/// One line of `vramlab run` output (read by `read`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepRecord {
    pub step: u64,
    pub cmd: Value,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CommandError>,
    /// A short explanation of what the command did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What the command returns, for commands that return something
    /// (losses, estimates, batch-size trials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// After a successful `restart`: the settings the new process runs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<Settings>,
    /// After a successful `restart`: the device it runs on (a GPU model
    /// changes its name and size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceInfo>,
    pub stats: Stats,
}

// ----- the websocket --------------------------------------------------------

messages! {
    /// Messages from a client to the server, tagged by `"type"` (written by
    /// serde, read by the reader each names in `read`; a field a message
    /// does not have is refused).
    pub enum ClientMessage {
        /// Run a command; its result comes back with the same `id`.
        Command {
            id: u64,
            /// Any JSON: a line that is not a valid command still gets a result
            /// (with the error) under its id.
            command: Box<CommandLine>,
        } = "command" => read::command,
        /// Several commands in one message (the code cell's lines as Python
        /// runs them): their ids are `first_id`, `first_id + 1`, …; each is
        /// answered as if sent alone, and the message counts once against the
        /// session's commands a second. At most [`MAX_BATCH`].
        Commands {
            first_id: u64,
            commands: Vec<CommandLine>,
        } = "commands" => read::commands,
        /// Receive live snapshots and events.
        Subscribe {} = "subscribe" => read::subscribe,
        Unsubscribe {} = "unsubscribe" => read::unsubscribe,
        /// Send a full snapshot now.
        Snapshot {} = "snapshot" => read::snapshot_request,
        /// The session as a PyTorch memory snapshot (segments and the event
        /// log since the last restart), for a file memory_viz opens.
        ExportSnapshot {} = "export_snapshot" => read::export_snapshot,
        /// Stop the running command after its current step.
        Stop {} = "stop" => read::stop,
        Ping {
            nonce: u64,
        } = "ping" => read::ping,
        /// What the owner's page shows beyond the numbers (the lesson step,
        /// the code cell, the explanation, the controls' values), for watchers.
        Presenter {
            view: Box<PresenterView>,
        } = "presenter" => read::presenter_view,
    }
}

/// The most commands one `commands` message holds.
pub const MAX_BATCH: usize = 64;

/// A lesson's index, the step it is at, and the last step's outcome
/// (passed, and the words).
pub type LessonAt = (usize, usize, Option<(bool, String)>);

/// What a presenter's page shows beyond the numbers, mirrored on every
/// watcher's page.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PresenterView {
    /// The lesson being played: its index, the step it is at, and the
    /// last step's outcome (passed, and the words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lesson: Option<LessonAt>,
    /// The code cell's text.
    #[serde(default)]
    pub cell: String,
    /// The Python pane's last lines (what the commands stand for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub code: Vec<String>,
    /// The explanation of the last command: which numbers moved, why, the
    /// link, and whether it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<ExplanationView>,
    /// Each control's value, by its element id.
    #[serde(default)]
    pub controls: std::collections::BTreeMap<String, String>,
    /// The code cell's statements as its run has reached them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statements: Vec<StatementView>,
    /// ▶ play: the steps done of the run's total, and the losses plotted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub play: Option<PlayView>,
}

/// A statement of the code cell: its lines, how far its run is
/// (`waiting`, `running`, `done`, `failed`), what it printed, and the
/// allocated bytes after it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StatementView {
    pub lines: (usize, usize),
    pub state: String,
    pub output: String,
    pub errors: String,
    /// Why it failed (Python's traceback, the session's refusal).
    pub why: String,
    pub allocated: Option<u64>,
}

/// ▶ play's run: steps done of `total`, and each step's loss.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PlayView {
    pub done: u64,
    pub total: u64,
    pub losses: Vec<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExplanationView {
    pub moved: String,
    pub why: String,
    pub link: (String, String),
    pub ok: bool,
}

/// Read by hand, as a hello is (`fields`): every watcher's page reads it.
impl<'de> Deserialize<'de> for PresenterView {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::fields::read(d, |f| {
            Ok(PresenterView {
                lesson: f.take("lesson")?,
                cell: f.take_or("cell", String::new())?,
                code: f.take_or("code", Vec::new())?,
                explanation: f.take("explanation")?,
                controls: f.take_or("controls", Default::default())?,
                statements: f.take_or("statements", Vec::new())?,
                play: f.take("play")?,
            })
        })
    }
}

impl<'de> Deserialize<'de> for StatementView {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::fields::read(d, |f| {
            Ok(StatementView {
                lines: f.take("lines")?,
                state: f.take("state")?,
                output: f.take_or("output", String::new())?,
                errors: f.take_or("errors", String::new())?,
                why: f.take_or("why", String::new())?,
                allocated: f.take("allocated")?,
            })
        })
    }
}

impl<'de> Deserialize<'de> for PlayView {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::fields::read(d, |f| {
            Ok(PlayView {
                done: f.take("done")?,
                total: f.take("total")?,
                losses: f.take_or("losses", Vec::new())?,
            })
        })
    }
}

impl<'de> Deserialize<'de> for ExplanationView {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::fields::read(d, |f| {
            Ok(ExplanationView {
                moved: f.take("moved")?,
                why: f.take("why")?,
                link: f.take("link")?,
                ok: f.take("ok")?,
            })
        })
    }
}

/// Whether a connection may change the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Owner,
    /// Sees everything live, changes nothing (team demos).
    Watcher,
}

vramlab_core::read_by_name!(Role {
    Owner = "owner",
    Watcher = "watcher",
});

/// The server's limits, as the client should know them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub max_message_bytes: u64,
    pub commands_per_second: u32,
    pub snapshot_interval_ms: u64,
    pub session_ttl_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_quota_bytes: Option<u64>,
}

/// Read by hand, as a hello is (`fields`).
impl<'de> Deserialize<'de> for Limits {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::fields::read(d, |f| {
            Ok(Limits {
                max_message_bytes: f.take("max_message_bytes")?,
                commands_per_second: f.take("commands_per_second")?,
                snapshot_interval_ms: f.take("snapshot_interval_ms")?,
                session_ttl_seconds: f.take("session_ttl_seconds")?,
                session_quota_bytes: f.take("session_quota_bytes")?,
            })
        })
    }
}

/// The first message on every connection (read by `read`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub session_id: String,
    /// Owners get the id a watcher joins with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch_id: Option<String>,
    pub role: Role,
    /// The session existed before this connection.
    pub resumed: bool,
    /// `sim` or `cuda`.
    pub backend: String,
    pub device: DeviceInfo,
    pub framework: Framework,
    pub settings: Settings,
    pub limits: Limits,
    /// Behind an authenticating proxy: who this connection is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Behind an authenticating proxy: whose session this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

messages! {
    /// Messages from the server, tagged by `"type"` (written by serde, read
    /// by the reader each names in `read`).
    pub enum ServerMessage {
        Hello(Box<Hello>) = "hello" => read::hello,
        /// The result of the command with this id (never dropped).
        Result {
            id: u64,
            #[serde(flatten)]
            record: Box<StepRecord>,
        } = "result" => read::result,
        /// A running command finished another step.
        Progress {
            id: u64,
            done: u64,
            total: u64,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            loss: Option<f32>,
        } = "progress" => read::progress,
        /// Everything, on connect and on request.
        Snapshot {
            snapshot: Box<Snapshot>,
        } = "snapshot" => read::snapshot,
        /// Who watches the session now (a watcher's user, or `anonymous`),
        /// sent to every connection when one joins or leaves.
        Watchers {
            watchers: Vec<String>,
        } = "watchers" => read::watchers,
        /// The answer to `export_snapshot`.
        MemorySnapshot {
            snapshot: Box<MemorySnapshot>,
        } = "memory_snapshot" => read::memory_snapshot,
        /// What changed since the last snapshot or delta this client received,
        /// with the exact peaks in between.
        Delta(Box<SnapshotDelta>) = "delta" => read::delta,
        /// The owner's page, for watchers (sent when it changes, and to a
        /// watcher when it joins).
        Presenter {
            view: Box<PresenterView>,
        } = "presenter" => read::presenter,
        /// Events since the last batch; `dropped` counts events this client
        /// missed because it was slow.
        Events {
            events: Vec<Event>,
            dropped: u64,
        } = "events" => read::events,
        Error {
            #[serde(default, skip_serializing_if = "Option::is_none")]
            id: Option<u64>,
            error: ConnectionError,
        } = "error" => read::error,
        Pong {
            nonce: u64,
        } = "pong" => read::pong,
    }
}

/// Kinds of error a connection (not a command) can meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionErrorKind {
    /// A websocket message that is not a valid client message.
    BadMessage,
    /// The message is larger than the server accepts.
    TooLarge,
    /// More commands per second than the server accepts from one connection.
    RateLimited,
    /// The session is running a command and its queue is full.
    Busy,
    /// A watcher tried to change the session.
    ReadOnly,
    /// The session or watch id is not known (or expired).
    UnknownSession,
    /// The server holds as many sessions as it may.
    SessionLimit,
    /// The session belongs to another user.
    NotYours,
    /// The server could not start a session (its GPU failed).
    ServerError,
    /// The server is stopping: the command was not run.
    ShuttingDown,
}

vramlab_core::read_by_name!(ConnectionErrorKind {
    BadMessage = "bad_message",
    TooLarge = "too_large",
    RateLimited = "rate_limited",
    Busy = "busy",
    ReadOnly = "read_only",
    UnknownSession = "unknown_session",
    SessionLimit = "session_limit",
    NotYours = "not_yours",
    ServerError = "server_error",
    ShuttingDown = "shutting_down",
});

/// A connection error as a value, in words a user understands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConnectionError {
    pub kind: ConnectionErrorKind,
    pub message: String,
}

/// Read by hand (`fields`).
impl<'de> Deserialize<'de> for ConnectionError {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::fields::read(d, |f| {
            Ok(ConnectionError {
                kind: f.take("kind")?,
                message: f.take("message")?,
            })
        })
    }
}

impl ConnectionError {
    pub fn new(kind: ConnectionErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for ConnectionError {}

/// Parses a client message; the error names the problem.
pub fn parse_client_message(text: &str) -> Result<ClientMessage, ConnectionError> {
    serde_json::from_str(text).map_err(|e| {
        ConnectionError::new(
            ConnectionErrorKind::BadMessage,
            format!("not a client message ({e}); expected e.g. {{\"type\":\"command\",\"id\":1,\"command\":{{\"cmd\":\"gc\"}}}}"),
        )
    })
}

/// How the engine turns lines into records: `vramlab run`, the websocket
/// and the lesson checker all go through here.
impl Engine {
    /// Parses and executes one line, as `vramlab run` does.
    pub fn run_line(&mut self, line: &str) -> StepRecord {
        self.run_parsed(&parse_line(line))
    }

    /// Executes a parsed line; a line that is not a command still takes a
    /// step and gets a record with its error.
    pub fn run_parsed(&mut self, parsed: &CommandLine) -> StepRecord {
        let result = match &parsed.command {
            Ok(cmd) => self.execute(cmd),
            Err(e) => Err(self.reject(e.clone())),
        };
        let (ok, error, note, value) = match result {
            Ok(o) => (true, None, o.note, o.value),
            Err(e) => (false, Some(e), None, None),
        };
        let restarted = ok && matches!(parsed.command, Ok(Command::Restart(_)));
        StepRecord {
            step: self.step() - 1,
            cmd: parsed.raw.clone(),
            ok,
            error,
            note,
            value,
            settings: restarted.then(|| self.settings().clone()),
            device: restarted.then(|| self.device_info()),
            stats: self.stats(),
        }
    }
}

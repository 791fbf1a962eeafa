//! A session of one page: the engine answering a page's client messages
//! with the messages the server sends, for the engine that runs in the page
//! (in a Web Worker). The same hello, full snapshot, deltas with the exact
//! peaks in between, event batches, progress and results as the websocket;
//! what only a server has (watchers, a real GPU, quotas) is not offered.
//!
//! No I/O here: the caller gives a [`Outlet`] (where messages go, and a
//! clock for the pace of live updates).

use super::session::{self, Identity};
use super::{ClientMessage, Limits, Role, ServerMessage, SNAPSHOT_EVENTS};
use crate::command::CommandLine;
use crate::engine::{Engine, Progress};
use crate::snapshot::Snapshot;
use crate::torch_snapshot::export;
use std::sync::{Arc, Mutex, PoisonError};

/// The backend a local session names in its hello.
pub const BACKEND: &str = "page";
/// The session id a local session names in its hello.
pub const SESSION_ID: &str = "local";
/// How often a running command's numbers are sent, at most (as the
/// server's default `--snapshot-interval-ms`).
pub const LIVE_INTERVAL_MS: f64 = 33.0;
/// The events an exported memory snapshot carries, at most.
const EXPORT_EVENTS: usize = 10_000;

/// Where a local session's messages go, and the clock (milliseconds) that
/// paces live updates during a long command. Plain functions, so the
/// progress hook stays `Send`.
#[derive(Clone, Copy)]
pub struct Outlet {
    pub post: fn(&ServerMessage),
    pub now_ms: fn() -> f64,
}

/// What the page has received of the engine's state.
#[derive(Default)]
struct Sent {
    snapshot: Option<Snapshot>,
    /// The next event sequence number the page has not seen.
    next_event: u64,
}

/// A stopped loop's line as it replays: a `train` of the steps it ran,
/// which leaves the same state as the loop stopped there, so later replays
/// of the session (here, or on a server it moves to) need no stop.
pub fn as_run(line: &mut serde_json::Value, steps: u64) {
    if let Some(map) = line.as_object_mut() {
        if map.get("cmd").and_then(|c| c.as_str()) == Some("train") {
            map.insert("steps".into(), steps.into());
        }
    }
}

/// The command a page stopped, to run again up to where it stopped.
pub struct Stopped {
    pub id: u64,
    pub line: CommandLine,
    /// The steps the page had seen done (at least one is run).
    pub after_steps: u64,
}

pub struct LocalSession {
    engine: Engine,
    outlet: Outlet,
    sent: Arc<Mutex<Sent>>,
    subscribed: bool,
}

impl LocalSession {
    /// A session on the simulated GPU; says hello and sends the first
    /// snapshot, as a server does on connect.
    pub fn start(outlet: Outlet) -> Self {
        let mut session = Self {
            engine: Engine::new_simulated(),
            outlet,
            sent: Arc::default(),
            subscribed: true,
        };
        (outlet.post)(&session.hello());
        (outlet.post)(&session.full_snapshot());
        session
    }

    /// A session the page starts again to stop a running command: a
    /// command that runs cannot read a stop, so the page ends its engine and
    /// starts a new one from the same command lines. The engine is
    /// deterministic, so replaying `lines` (silently) brings back the same
    /// state; then a resumed hello, a full snapshot, and `stopped` runs
    /// again, stopping after as many steps as the page had seen done, as a
    /// server stops a command after its current step.
    pub fn resume(outlet: Outlet, lines: &[CommandLine], stopped: Option<Stopped>) -> Self {
        let mut session = Self {
            engine: Engine::new_simulated(),
            outlet,
            sent: Arc::default(),
            subscribed: true,
        };
        for line in lines {
            session.engine.run_parsed(line);
        }
        (outlet.post)(&session.hello_as(true));
        (outlet.post)(&session.full_snapshot());
        if let Some(s) = stopped {
            session.run(s.id, &s.line, s.after_steps.max(1));
        }
        session
    }

    pub fn hello(&self) -> ServerMessage {
        self.hello_as(false)
    }

    /// The page's hello: its owner, on the page's engine, with no limits
    /// a server sets.
    fn hello_as(&self, resumed: bool) -> ServerMessage {
        let who = Identity {
            session_id: SESSION_ID.into(),
            watch_id: None,
            role: Role::Owner,
            resumed,
            backend: BACKEND.into(),
            user: None,
            owner: None,
        };
        let limits = Limits {
            max_message_bytes: u64::MAX,
            commands_per_second: 1000,
            snapshot_interval_ms: LIVE_INTERVAL_MS as u64,
            session_ttl_seconds: 0,
            session_quota_bytes: None,
        };
        let settings = self.engine.settings().clone();
        session::hello(settings, self.engine.device_info(), who, limits)
    }

    /// Answers one message from the page (a JSON text).
    pub fn handle(&mut self, text: &str) {
        let post = self.outlet.post;
        let msg = match super::parse_client_message(text) {
            Ok(msg) => msg,
            Err(error) => return post(&ServerMessage::Error { id: None, error }),
        };
        match msg {
            ClientMessage::Command { id, command } => self.run(id, &command, u64::MAX),
            ClientMessage::Commands { first_id, commands } => {
                for (id, command) in (first_id..).zip(&commands) {
                    self.run(id, command, u64::MAX);
                }
            }
            ClientMessage::Subscribe {} => self.subscribed = true,
            ClientMessage::Unsubscribe {} => self.subscribed = false,
            ClientMessage::Snapshot {} => post(&self.full_snapshot()),
            ClientMessage::ExportSnapshot {} => post(&self.export()),
            ClientMessage::Ping { nonce } => post(&ServerMessage::Pong { nonce }),
            // A command runs to its end before the next message is read, so
            // there is nothing to stop; nobody watches a page's session.
            ClientMessage::Stop {} | ClientMessage::Presenter { .. } => {}
        }
    }

    /// Runs one command: live updates while it runs (when subscribed),
    /// then its result and the last update. A loop of steps stops once
    /// `stop_after` are done.
    fn run(&mut self, id: u64, line: &CommandLine, stop_after: u64) {
        let outlet = self.outlet;
        let subscribed = self.subscribed;
        if subscribed || stop_after < u64::MAX {
            let sent = self.sent.clone();
            let mut last = (outlet.now_ms)();
            self.engine
                .set_progress_hook(Some(Box::new(move |e: &mut Engine, p: &Progress| {
                    let now = (outlet.now_ms)();
                    let go_on = p.done < stop_after;
                    let last_one = p.done == p.total || !go_on;
                    if subscribed && (now - last >= LIVE_INTERVAL_MS || last_one) {
                        post_updates(e, &sent, Some((id, p)), outlet.post);
                        last = now;
                    }
                    go_on
                })));
        }
        let record = self.engine.run_parsed(line);
        self.engine.set_progress_hook(None);
        // The result first: its numbers reach the screen before the page
        // redraws the segment map and the tables from the delta.
        (outlet.post)(&ServerMessage::Result {
            id,
            record: Box::new(record),
        });
        if self.subscribed {
            post_updates(&mut self.engine, &self.sent, None, outlet.post);
        }
    }

    /// Everything now, with the latest events (the page starts over from it).
    fn full_snapshot(&mut self) -> ServerMessage {
        let snapshot = self.engine.snapshot(SNAPSHOT_EVENTS);
        self.engine.take_sample_peaks();
        let mut sent = lock(&self.sent);
        sent.next_event = snapshot.events.last().map_or(0, |e| e.seq + 1);
        sent.snapshot = Some(Snapshot {
            events: Vec::new(),
            ..snapshot.clone()
        });
        ServerMessage::Snapshot {
            snapshot: Box::new(snapshot),
        }
    }

    fn export(&self) -> ServerMessage {
        let snapshot = self.engine.snapshot(EXPORT_EVENTS);
        ServerMessage::MemorySnapshot {
            snapshot: Box::new(export::from_session(&snapshot)),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

fn lock(sent: &Mutex<Sent>) -> std::sync::MutexGuard<'_, Sent> {
    sent.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends what changed since the page's last update ([`session::update`]):
/// the running command's progress, a delta with the exact peaks in
/// between, then the new events.
fn post_updates(
    engine: &mut Engine,
    sent: &Mutex<Sent>,
    progress: Option<(u64, &Progress)>,
    post: fn(&ServerMessage),
) {
    let new = engine.snapshot(0);
    let peaks = engine.take_sample_peaks();
    let mut sent = lock(sent);
    let old = sent.snapshot.as_ref().unwrap_or(&new);
    let first_unsent = sent.next_event;
    let fresh = engine.events_since(first_unsent);
    let messages = session::update(progress, (old, &new), peaks, fresh, first_unsent);
    if let Some(last) = session::last_event(&messages) {
        sent.next_event = last + 1;
    }
    messages.iter().for_each(post);
    sent.snapshot = Some(new);
}

#[cfg(test)]
mod tests;

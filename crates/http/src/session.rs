//! Sessions: each owns an engine that runs on a thread of its own, so a long
//! command never blocks a socket, and outlives its connection for a while so
//! a client can reconnect.
//!
//! Commands run one after another in the order they arrive (a bounded queue;
//! past it the client is told the session is busy). Results go to every
//! client of the session through a bounded outbox (a client that lets it
//! fill is dropped: its connection ends); while no owner is connected the
//! last `OUTBOX_MESSAGES` wait for it. The engine publishes a snapshot at most every
//! `snapshot_interval` while a command runs and after every command; clients
//! take the latest (coalescing) and still learn the exact peaks in between.

use crate::metrics::{Gauges, Metrics};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc as tmpsc, watch};
use vramlab_backend::Backend;
use vramlab_shared::command::CommandLine;
use vramlab_shared::device::{Device, QuotaDevice};
use vramlab_shared::engine::{DeviceFactory, Progress};
use vramlab_shared::framework::Settings;
use vramlab_shared::protocol::session::{self as messages, Identity};
use vramlab_shared::protocol::{
    ConnectionError, ConnectionErrorKind, Limits, PresenterView, Role, ServerMessage,
};
use vramlab_shared::snapshot::{Event, Snapshot};
use vramlab_shared::CommandError;
use vramlab_shared::Engine;

/// How many published samples keep their peaks (at 30 Hz, two minutes).
const PEAK_HISTORY: usize = 4096;
/// How many recent events a session keeps for its clients.
const EVENT_HISTORY: usize = 10_000;

#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub ttl: Duration,
    pub snapshot_interval: Duration,
    pub max_queue: usize,
    pub max_sessions: usize,
    /// The most sessions one client address may hold; 0: no limit.
    pub max_per_client: usize,
    /// The most watchers one session may have.
    pub max_watchers: usize,
    pub quota: Option<u64>,
    pub limits: Limits,
    /// Behind a load balancer: this server's name, the start of every
    /// session and watch id it hands out, so the balancer can route a
    /// reconnect or a watch link back here.
    pub instance: Option<String>,
}

/// A new id, starting with the instance's name when there is one.
fn new_id(instance: Option<&str>) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    match instance {
        Some(name) => format!("{name}-{id}"),
        None => id,
    }
}

/// How long a session that never ran a command outlives its owner's
/// connection (at most; the TTL when shorter).
pub const UNUSED_GRACE: Duration = Duration::from_secs(30);

/// A message already serialized once for every client.
pub type Wire = Arc<str>;

pub fn wire(msg: &ServerMessage) -> Wire {
    serde_json::to_string(msg)
        .expect("server messages serialize")
        .into()
}

/// What the engine thread last published.
#[derive(Debug)]
pub struct Live {
    pub version: u64,
    pub snapshot: Arc<Snapshot>,
    /// (version, peak allocated, peak reserved) of the window that ended at
    /// each published version.
    peaks: VecDeque<(u64, u64, u64)>,
    pub events: VecDeque<Event>,
    /// The running command's progress: (command id, progress).
    pub progress: Option<(u64, Progress)>,
    /// The last versions' changes, encoded once for every connection.
    pub updates: updates::Updates,
}

impl Live {
    /// The highest (allocated, reserved) since `after` (a version the client
    /// saw), up to now.
    pub fn peaks_since(&self, after: u64) -> (u64, u64) {
        let mut peaks = (0, 0);
        let covered = self.peaks.front().is_some_and(|&(v, _, _)| v <= after + 1);
        if !covered {
            // Older than the history: the all-time peaks bound it.
            let s = &self.snapshot.stats;
            return (s.peak_allocated_bytes, s.peak_reserved_bytes);
        }
        for &(v, a, r) in &self.peaks {
            if v > after {
                peaks = (peaks.0.max(a), peaks.1.max(r));
            }
        }
        peaks
    }
}

/// A command for the session's engine thread, with the client's id for it.
struct Job {
    id: u64,
    line: Box<CommandLine>,
}

struct Client {
    role: Role,
    /// Who it is, behind an authenticating proxy.
    user: Option<String>,
    outbox: tmpsc::Sender<Wire>,
}

/// Messages waiting for one connection (results, errors); a client that
/// lets this many pile up is too slow and is dropped, so no connection can
/// make the server hold its messages without bound.
pub const OUTBOX_MESSAGES: usize = 256;

/// A session's changing state, shared by its connections and its engine
/// thread behind one lock (each holder only long enough to read or change
/// it: no lock is held while a command runs or a message is written).
struct State {
    /// Where commands go; `None` once the session has ended or the server
    /// is stopping.
    jobs: Option<mpsc::Sender<Job>>,
    /// The server is stopping: commands are refused, and those still
    /// queued are answered unrun.
    stopping: bool,
    /// Commands submitted and not yet answered.
    queued: usize,
    clients: HashMap<u64, Client>,
    next_client: u64,
    /// Results produced while no owner was connected.
    pending: VecDeque<Wire>,
    live: Live,
    /// When the last owner left (None while one is connected).
    detached_since: Option<Instant>,
    /// A command was ever submitted.
    used: bool,
    /// The owner's commands and snapshot requests a second, all its
    /// connections together.
    rate: crate::rate::RateLimit,
    /// The watchers' snapshot requests a second, all watchers together: a
    /// budget of their own, so no watcher spends the owner's.
    watcher_rate: crate::rate::RateLimit,
    /// The owner's page, for watchers.
    presenter: presenter::Presenter<Wire>,
    hello: (Settings, vramlab_shared::device::DeviceInfo),
}

impl State {
    fn owner_connected(&self) -> bool {
        self.clients.values().any(|c| c.role == Role::Owner)
    }

    /// Who watches now: each watcher's user, or `anonymous`, sorted.
    fn watcher_names(&self) -> Vec<String> {
        let mut names: Vec<String> = (self.clients.values())
            .filter(|c| c.role == Role::Watcher)
            .map(|c| c.user.clone().unwrap_or_else(|| "anonymous".into()))
            .collect();
        names.sort();
        names
    }
}

pub struct Session {
    pub id: String,
    pub watch_id: String,
    state: Mutex<State>,
    /// Stops the running command after its current step: read by the
    /// engine's progress hook while the command runs, so not in `state`.
    stop: AtomicBool,
    live_tx: watch::Sender<u64>,
    /// The address of the client that made it, when known.
    client: Option<IpAddr>,
    /// The user who made it, behind an authenticating proxy: only they may
    /// resume it.
    pub owner: Option<String>,
    config: SessionConfig,
    backend_name: &'static str,
    metrics: Arc<Metrics>,
}

/// The live publication, read under the session's lock.
pub struct LiveGuard<'a>(MutexGuard<'a, State>);

impl std::ops::Deref for LiveGuard<'_> {
    type Target = Live;
    fn deref(&self) -> &Live {
        &self.0.live
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Starts devices with the server's per-session quota.
struct QuotaFactory {
    inner: Box<dyn DeviceFactory>,
    quota: Option<u64>,
}

impl DeviceFactory for QuotaFactory {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        let device = self.inner.start(settings)?;
        Ok(match self.quota {
            Some(q) => Box::new(QuotaDevice::new(device, q)),
            None => device,
        })
    }
}

/// A registered connection: its id, its messages, and the live versions.
pub struct Attachment {
    pub client: u64,
    pub outbox: tmpsc::Receiver<Wire>,
    pub live: watch::Receiver<u64>,
}

impl Session {
    fn new(
        backend: &Backend,
        config: SessionConfig,
        metrics: Arc<Metrics>,
        (client, owner): (Option<IpAddr>, Option<String>),
    ) -> anyhow::Result<Arc<Session>> {
        let factory = QuotaFactory {
            inner: backend.factory(),
            quota: config.quota,
        };
        let mut engine = Engine::new(Box::new(factory), Settings::default())
            .map_err(|e| anyhow::anyhow!(e.message))?;
        let snapshot = Arc::new(engine.snapshot(0));
        let _ = engine.take_sample_peaks();
        let (live_tx, _) = watch::channel(0);
        let (tx, rx) = mpsc::channel();
        let state = State {
            jobs: Some(tx),
            stopping: false,
            queued: 0,
            clients: HashMap::new(),
            next_client: 0,
            pending: VecDeque::new(),
            live: Live {
                version: 0,
                snapshot,
                peaks: VecDeque::new(),
                events: VecDeque::new(),
                progress: None,
                updates: updates::Updates::default(),
            },
            detached_since: Some(Instant::now()),
            used: false,
            rate: crate::rate::RateLimit::new(config.limits.commands_per_second),
            watcher_rate: crate::rate::RateLimit::new(config.limits.commands_per_second),
            presenter: presenter::Presenter::new(),
            hello: (engine.settings().clone(), engine.device_info()),
        };
        let session = Arc::new(Session {
            id: new_id(config.instance.as_deref()),
            watch_id: new_id(config.instance.as_deref()),
            state: Mutex::new(state),
            stop: AtomicBool::new(false),
            live_tx,
            client,
            owner,
            config,
            backend_name: backend.name,
            metrics,
        });
        let s = session.clone();
        std::thread::Builder::new()
            .name(format!("session-{}", &session.id[..8]))
            .spawn(move || thread::run_engine(s, engine, rx))?;
        Ok(session)
    }

    /// The hello for a connection with this role.
    pub fn hello(&self, role: Role, resumed: bool, user: Option<String>) -> ServerMessage {
        let (settings, device) = self.state().hello.clone();
        let who = Identity {
            // A watcher learns only the id it watches with: the owner's id
            // would give it the owner's rights on its next connection.
            session_id: match role {
                Role::Owner => self.id.clone(),
                Role::Watcher => self.watch_id.clone(),
            },
            watch_id: (role == Role::Owner).then(|| self.watch_id.clone()),
            role,
            resumed,
            backend: self.backend_name.to_string(),
            user,
            owner: self.owner.clone(),
        };
        messages::hello(settings, device, who, self.config.limits.clone())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("session lock")
    }

    /// Takes one of the commands-a-second tokens of `role`'s budget (the
    /// owner's, or the watchers' together), if one is left.
    pub fn allow(&self, role: Role) -> bool {
        let mut state = self.state();
        match role {
            Role::Owner => state.rate.allow(),
            Role::Watcher => state.watcher_rate.allow(),
        }
    }

    /// Connections watching (read-only) now.
    pub fn watchers(&self) -> usize {
        let state = self.state();
        state
            .clients
            .values()
            .filter(|c| c.role == Role::Watcher)
            .count()
    }

    /// Registers a connection. A new watcher is announced to everyone; an
    /// owner hears who already watches.
    pub fn attach(&self, role: Role, user: Option<String>) -> Attachment {
        let (tx, rx) = tmpsc::channel(OUTBOX_MESSAGES);
        let mut state = self.state();
        let client = state.next_client;
        state.next_client += 1;
        if role == Role::Owner {
            state.detached_since = None;
            for msg in state.pending.drain(..) {
                let _ = tx.try_send(msg);
            }
        }
        let outbox = tx.clone();
        state.clients.insert(client, Client { role, user, outbox });
        let watchers = state.watcher_names();
        let view = state.presenter.latest();
        drop(state);
        if role == Role::Watcher {
            if let Some(view) = view {
                let _ = tx.try_send(view);
            }
            self.broadcast(wire(&ServerMessage::Watchers { watchers }), false);
        } else if !watchers.is_empty() {
            let _ = tx.try_send(wire(&ServerMessage::Watchers { watchers }));
        }
        Attachment {
            client,
            outbox: rx,
            live: self.live_tx.subscribe(),
        }
    }

    /// A connection closed.
    /// A connection closed. What it was given but never wrote (`unsent`,
    /// oldest first: a result that waited behind a stalled write) is kept
    /// for the owner's next connection when no other owner has it.
    pub fn detach(&self, client: u64, role: Role, unsent: Vec<Wire>) {
        let mut state = self.state();
        state.clients.remove(&client);
        if !state.owner_connected() {
            state.detached_since = Some(Instant::now());
            if role == Role::Owner {
                for msg in unsent.into_iter().rev() {
                    state.pending.push_front(msg);
                }
                state.pending.truncate(OUTBOX_MESSAGES);
            }
        }
        let watchers = state.watcher_names();
        drop(state);
        if role == Role::Watcher {
            self.broadcast(wire(&ServerMessage::Watchers { watchers }), false);
        }
    }

    /// Who watches now: each watcher's user, or `anonymous`, sorted.
    pub fn watcher_names(&self) -> Vec<String> {
        self.state().watcher_names()
    }

    /// The owner's page changed: keep it and pass it to the watchers.
    /// Refused when updates come faster than the presenter's limit.
    pub fn present(&self, view: Box<PresenterView>) -> Result<(), ConnectionError> {
        let msg = wire(&ServerMessage::Presenter { view });
        let mut state = self.state();
        if !state.presenter.update(msg.clone()) {
            return Err(ConnectionError::new(
                ConnectionErrorKind::RateLimited,
                "the page's view is mirrored to watchers at most 10 times a second: this update was dropped",
            ));
        }
        for c in state.clients.values().filter(|c| c.role == Role::Watcher) {
            let _ = c.outbox.try_send(msg.clone());
        }
        Ok(())
    }

    /// Sends a message to every client; keeps it for the owner when none
    /// is connected.
    /// A client whose outbox is full is dropped (its connection ends).
    fn broadcast(&self, msg: Wire, keep_for_owner: bool) {
        let mut state = self.state();
        state
            .clients
            .retain(|_, c| match c.outbox.try_send(msg.clone()) {
                Err(tmpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(session = %&self.id[..8], "a client reads too slowly: dropped");
                    false
                }
                _ => true,
            });
        if keep_for_owner && !state.owner_connected() {
            if state.pending.len() == OUTBOX_MESSAGES {
                state.pending.pop_front();
            }
            state.pending.push_back(msg);
        }
    }

    /// Queues a command; refuses when the queue is full.
    pub fn submit(&self, id: u64, line: Box<CommandLine>) -> Result<(), ConnectionError> {
        let mut state = self.state();
        state.used = true;
        if state.queued >= self.config.max_queue {
            return Err(ConnectionError::new(
                ConnectionErrorKind::Busy,
                format!(
                    "busy: {} commands are already waiting (the most is {}); send it again when a result comes back",
                    state.queued, self.config.max_queue
                ),
            ));
        }
        match state.jobs.as_ref().map(|tx| tx.send(Job { id, line })) {
            Some(Ok(())) => {
                state.queued += 1;
                Ok(())
            }
            _ if state.stopping => Err(shutting_down()),
            _ => Err(ConnectionError::new(
                ConnectionErrorKind::UnknownSession,
                "the session has ended",
            )),
        }
    }

    /// The server is stopping: the running command stops after its
    /// current step (and is answered), new commands are refused, and the
    /// ones still queued are answered unrun.
    pub(crate) fn stop_for_shutdown(&self) {
        let mut state = self.state();
        state.stopping = true;
        state.jobs.take();
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Stops the running command after its current step.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// What the engine published last (the session is locked while the
    /// guard lives).
    pub fn live(&self) -> LiveGuard<'_> {
        LiveGuard(self.state())
    }

    /// Whether the session has been without its owner for longer than it
    /// may: the TTL, or [`UNUSED_GRACE`] for one that never ran a command
    /// (so connect-and-drop cannot hold every slot for a whole TTL).
    fn expired(&self, now: Instant) -> bool {
        let state = self.state();
        let ttl = if state.used {
            self.config.ttl
        } else {
            self.config.ttl.min(UNUSED_GRACE)
        };
        let gone = state
            .detached_since
            .is_some_and(|t| now.duration_since(t) >= ttl);
        gone && !state.owner_connected()
    }

    /// How long it has had no connection at all (owner or watcher), and
    /// whether it ever ran a command; `None` while one is connected.
    fn unattended(&self, now: Instant) -> Option<(bool, Duration)> {
        let state = self.state();
        if !state.clients.is_empty() {
            return None;
        }
        let since = state.detached_since?;
        Some((state.used, now.duration_since(since)))
    }

    /// Whether a command is queued or running.
    fn busy(&self) -> bool {
        self.state().queued > 0
    }

    /// Ends the session: the engine stops after its current step, its
    /// thread ends, and everything it held is released.
    fn shut_down(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let msg = wire(&ServerMessage::Error {
            id: None,
            error: ConnectionError::new(
                ConnectionErrorKind::UnknownSession,
                "the session has ended",
            ),
        });
        let mut state = self.state();
        state.jobs.take();
        for c in state.clients.values() {
            let _ = c.outbox.try_send(msg.clone());
        }
        state.clients.clear();
    }
}

fn shutting_down() -> ConnectionError {
    ConnectionError::new(
        ConnectionErrorKind::ShuttingDown,
        "the server is stopping: this command was not run (connect again to reach a running server)",
    )
}

mod presenter;
mod registry;
mod thread;
mod updates;
pub use registry::Sessions;

#[cfg(test)]
mod tests;

//! One session's messages, whoever runs it: the server's session thread
//! behind a websocket (`vramlab_http::session`) or the engine in the page
//! (`local::LocalSession`). The hello and each update (the running
//! command's progress, the delta from what the client has with the exact
//! peaks in between, the latest events) are built here once; where they
//! go, and who may ask for what, is the runner's.

use super::{Hello, Limits, Role, ServerMessage, LIVE_EVENT_BATCH, PROTOCOL_VERSION};
use crate::device::DeviceInfo;
use crate::engine::Progress;
use crate::framework::Settings;
use crate::snapshot::{diff, Event, Snapshot};

/// Who a hello is for, and where the session runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The id this connection resumes the session with (a watcher's is
    /// the watch id: the owner's would give it the owner's rights).
    pub session_id: String,
    /// The id a watcher joins with (the owner's hello only).
    pub watch_id: Option<String>,
    pub role: Role,
    /// The session existed before this connection.
    pub resumed: bool,
    /// `sim`, `cuda`, or `page`.
    pub backend: String,
    /// Behind an authenticating proxy: who this connection is, and whose
    /// session it is.
    pub user: Option<String>,
    pub owner: Option<String>,
}

/// The hello: who, on which device, with which settings and limits.
pub fn hello(
    settings: Settings,
    device: DeviceInfo,
    who: Identity,
    limits: Limits,
) -> ServerMessage {
    ServerMessage::Hello(Box::new(Hello {
        protocol_version: PROTOCOL_VERSION,
        session_id: who.session_id,
        watch_id: who.watch_id,
        role: who.role,
        resumed: who.resumed,
        backend: who.backend,
        device,
        framework: settings.framework,
        settings,
        limits,
        user: who.user,
        owner: who.owner,
    }))
}

/// Command `id`'s progress.
pub fn progress(id: u64, p: &Progress) -> ServerMessage {
    ServerMessage::Progress {
        id,
        done: p.done,
        total: p.total,
        loss: p.loss,
    }
}

/// What a client that has `old` (and every event before `first_unsent`)
/// gets to have `new`: the running command's progress, the delta with the
/// peaks (allocated, reserved) since `old`, then the latest events of
/// `fresh` (those from `first_unsent` on), when there are any.
pub fn update<'a>(
    progress: Option<(u64, &Progress)>,
    (old, new): (&Snapshot, &Snapshot),
    peaks: (u64, u64),
    fresh: impl Iterator<Item = &'a Event>,
    first_unsent: u64,
) -> Vec<ServerMessage> {
    let mut out = Vec::with_capacity(3);
    if let Some((id, p)) = progress {
        out.push(self::progress(id, p));
    }
    out.push(ServerMessage::Delta(Box::new(diff(old, new, peaks))));
    let (events, dropped) = event_batch(fresh, first_unsent);
    if !events.is_empty() {
        out.push(ServerMessage::Events { events, dropped });
    }
    out
}

/// The latest [`LIVE_EVENT_BATCH`] of `fresh` (events from `first_unsent`
/// on), and how many the client misses: those cut here and those the log
/// no longer holds.
pub fn event_batch<'a>(
    fresh: impl Iterator<Item = &'a Event>,
    first_unsent: u64,
) -> (Vec<Event>, u64) {
    let fresh: Vec<&Event> = fresh.collect();
    let oldest = fresh.first().map_or(first_unsent, |e| e.seq);
    let skip = fresh.len().saturating_sub(LIVE_EVENT_BATCH);
    let dropped = oldest.saturating_sub(first_unsent) + skip as u64;
    (fresh.into_iter().skip(skip).cloned().collect(), dropped)
}

/// The last event's number in `messages` (an update's), if it has events.
pub fn last_event(messages: &[ServerMessage]) -> Option<u64> {
    messages.iter().rev().find_map(|m| match m {
        ServerMessage::Events { events, .. } => events.last().map(|e| e.seq),
        _ => None,
    })
}

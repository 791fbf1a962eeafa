//! One websocket connection: its session (new, resumed, or watched), the
//! client's messages in, results and live snapshots out.
//!
//! Results and errors travel through the session's bounded outbox (a
//! client that lets it fill is dropped, so one slow reader cannot hold a
//! session's memory). Live snapshots are coalesced: when the client is slow it gets
//! the latest state, with the exact peaks of everything it missed, and the
//! engine never waits for it.

use crate::app::AppState;
use crate::metrics::Metrics;
use crate::session::{wire, Session, Wire};
use axum::extract::ws::{Message, WebSocket};
use axum::extract::{Query, State, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use std::sync::Arc;
use vramlab_shared::command::CommandLine;
use vramlab_shared::protocol::{
    parse_client_message, session::update, ClientMessage, ConnectionError, ConnectionErrorKind,
    Role, ServerMessage, SNAPSHOT_EVENTS,
};
use vramlab_shared::snapshot::Snapshot;
use vramlab_shared::torch_snapshot::export;

#[derive(Debug, Default, Deserialize)]
pub struct WsQuery {
    /// Resume this session.
    pub session: Option<String>,
    /// Watch the session with this watch id, read-only.
    pub watch: Option<String>,
}

pub async fn ws_handler(
    ws: WebSocketUpgrade,
    Query(query): Query<WsQuery>,
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<crate::listener::Peer>>>,
) -> Response {
    let peer = peer.map(|axum::Extension(axum::extract::ConnectInfo(peer))| peer.0.ip());
    let client = state.access.client(&headers, peer);
    // A draining server takes no new session: a balancer tries another.
    if query.session.is_none() && query.watch.is_none() && state.sessions.is_draining() {
        return (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "this server is draining: connect again to reach another",
        )
            .into_response();
    }
    let user = match state.access.user(&headers, peer) {
        Ok(user) => user,
        Err(why) => {
            Metrics::inc(&state.sessions.metrics.refused.user);
            return (axum::http::StatusCode::UNAUTHORIZED, why).into_response();
        }
    };
    // Frames up to 4x the limit reach us, so a client is told its message
    // was too large instead of being cut off; beyond that the socket closes.
    let hard = state.limits.max_message_bytes.saturating_mul(4) as usize;
    ws.max_message_size(hard)
        .max_frame_size(hard)
        .on_upgrade(move |socket| connection(socket, query, state, (client, user)))
}

fn error_msg(id: Option<u64>, kind: ConnectionErrorKind, message: impl Into<String>) -> Wire {
    wire(&ServerMessage::Error {
        id,
        error: ConnectionError::new(kind, message),
    })
}

/// Finds or makes the session this connection belongs to. A new session
/// starts on a blocking thread: it may create a CUDA context.
async fn resolve(
    state: &AppState,
    query: &WsQuery,
    (client, user): Who,
) -> Result<(Arc<Session>, Role, bool), Wire> {
    if let Some(watch) = &query.watch {
        let Some(session) = state.sessions.by_watch_id(watch) else {
            return Err(error_msg(
                None,
                ConnectionErrorKind::UnknownSession,
                "no session has that watch id (it may have ended)",
            ));
        };
        let max = state.sessions.config().max_watchers;
        if session.watchers() >= max {
            Metrics::inc(&state.sessions.metrics.refused.session_limit);
            return Err(error_msg(
                None,
                ConnectionErrorKind::SessionLimit,
                format!("this session already has {max} watchers, the most it may"),
            ));
        }
        return Ok((session, Role::Watcher, true));
    }
    if let Some(id) = &query.session {
        let session = state
            .sessions
            .get(id)
            .ok_or_else(|| error_msg(None, ConnectionErrorKind::UnknownSession, format!("session {id} is not known: it expired or never existed; connect without ?session= for a new one")))?;
        if session.owner != user {
            Metrics::inc(&state.sessions.metrics.refused.user);
            return Err(error_msg(
                None,
                ConnectionErrorKind::NotYours,
                "that session belongs to another user: ask them for its watch link",
            ));
        }
        return Ok((session, Role::Owner, true));
    }
    let sessions = state.sessions.clone();
    let created = tokio::task::spawn_blocking(move || sessions.create_as(client, user))
        .await
        .unwrap_or_else(|e| {
            Err(ConnectionError::new(
                ConnectionErrorKind::ServerError,
                format!("the server could not start a session: {e}"),
            ))
        });
    created
        .map(|s| (s, Role::Owner, false))
        .map_err(|e| wire(&ServerMessage::Error { id: None, error: e }))
}

/// The peer's address and, behind an authenticating proxy, its user.
type Who = (Option<std::net::IpAddr>, Option<String>);

async fn connection(socket: WebSocket, query: WsQuery, state: AppState, who: Who) {
    let (mut sink, mut stream) = socket.split();
    let user = who.1.clone();
    let (session, role, resumed) = match resolve(&state, &query, who).await {
        Ok(found) => found,
        Err(msg) => {
            let _ = sink.send(Message::Text(msg.to_string().into())).await;
            let _ = sink.close().await;
            return;
        }
    };
    Metrics::inc(&state.sessions.metrics.connections);
    tracing::info!(session = %&session.id[..8], ?role, resumed, "connected");
    let hello = wire(&session.hello(role, resumed, user.clone()));
    let mut attachment = session.attach(role, user);
    let mut client = ClientState::new();
    let first = client.full_snapshot(&session);
    let max = state.limits.max_message_bytes as usize;
    let mut ok = send(&mut sink, &hello).await && send(&mut sink, &first).await;
    let mut heard = tokio::time::Instant::now();
    let mut keepalive = tokio::time::interval(state.keepalive.ping_every);
    // A result the session handed over that did not go out.
    let mut unsent = Vec::new();
    while ok {
        tokio::select! {
            incoming = stream.next() => {
                heard = tokio::time::Instant::now();
                let text = match incoming {
                    Some(Ok(Message::Text(t))) => t.to_string(),
                    Some(Ok(Message::Binary(b))) => String::from_utf8_lossy(&b).into_owned(),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(Message::Close(_))) => {
                        // The closing handshake answered (not a bare TCP
                        // close, which the client reads as 1006).
                        let _ = tokio::time::timeout(WRITE_TIMEOUT, sink.close()).await;
                        break;
                    }
                    None | Some(Err(_)) => break,
                };
                for reply in handle(&text, max, role, &session, &mut client, &state) {
                    ok = send(&mut sink, &reply).await;
                    if !ok {
                        break;
                    }
                }
                if ok && std::mem::take(&mut client.export_asked) {
                    let of = session.clone();
                    if let Some(exported) = state.heavy.run(move || export(&of)).await {
                        ok = send(&mut sink, &exported).await;
                    }
                }
            }
            out = attachment.outbox.recv() => match out {
                Some(msg) => {
                    ok = send(&mut sink, &msg).await;
                    if !ok {
                        unsent.push(msg);
                    }
                }
                None => {
                    // The session ended (the server stops, or it expired).
                    close_going_away(&mut sink).await;
                    break;
                }
            },
            _ = keepalive.tick() => {
                // A client that answers nothing (not even a ping) is gone.
                if heard.elapsed() > state.keepalive.idle {
                    tracing::info!(session = %&session.id[..8], "idle connection closed");
                    break;
                }
                ok = write(&mut sink, Message::Ping(Vec::new().into())).await;
            }
            changed = attachment.live.changed(), if client.subscribed => {
                if changed.is_err() {
                    break;
                }
                for msg in client.updates(&session) {
                    ok = ok && send(&mut sink, &msg).await;
                }
            }
        }
    }
    // What is still queued for this connection goes back to the session,
    // so a reconnecting owner gets every result.
    while let Ok(msg) = attachment.outbox.try_recv() {
        unsent.push(msg);
    }
    session.detach(attachment.client, role, unsent);
    let connections = &state.sessions.metrics.connections;
    connections.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(session = %&session.id[..8], ?role, "disconnected");
}

/// Closes with 1001 (going away).
async fn close_going_away(sink: &mut futures_util::stream::SplitSink<WebSocket, Message>) {
    let close = axum::extract::ws::CloseFrame {
        code: axum::extract::ws::close_code::AWAY,
        reason: "closed by the server".into(),
    };
    let _ = write(sink, Message::Close(Some(close))).await;
}

/// How long one message may take to go out; a client that does not read
/// is disconnected rather than held.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn send(sink: &mut futures_util::stream::SplitSink<WebSocket, Message>, msg: &Wire) -> bool {
    write(sink, Message::Text(msg.to_string().into())).await
}

async fn write(
    sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    msg: Message,
) -> bool {
    matches!(
        tokio::time::timeout(WRITE_TIMEOUT, sink.send(msg)).await,
        Ok(Ok(()))
    )
}

/// What this connection last received of the live state.
struct ClientState {
    subscribed: bool,
    /// An export was asked for: made off the runtime, then sent.
    export_asked: bool,
    last_snapshot: Option<Arc<Snapshot>>,
    last_version: u64,
    last_event: Option<u64>,
}

impl ClientState {
    fn new() -> Self {
        ClientState {
            subscribed: true,
            export_asked: false,
            last_snapshot: None,
            last_version: 0,
            last_event: None,
        }
    }

    fn full_snapshot(&mut self, session: &Session) -> Wire {
        let live = session.live();
        let mut snapshot = (*live.snapshot).clone();
        snapshot.events = live
            .events
            .iter()
            .rev()
            .take(SNAPSHOT_EVENTS)
            .rev()
            .cloned()
            .collect();
        self.last_event = live.events.back().map(|e| e.seq);
        self.last_version = live.version;
        self.last_snapshot = Some(live.snapshot.clone());
        drop(live);
        wire(&ServerMessage::Snapshot {
            snapshot: Box::new(snapshot),
        })
    }

    /// A delta, new events and progress since what this client last got.
    fn updates(&mut self, session: &Session) -> Vec<Wire> {
        let live = session.live();
        if live.version == self.last_version {
            return Vec::new();
        }
        // Encoded once on the session's thread for every connection.
        if let Some(shared) = live.updates.since(self.last_version, live.version) {
            self.last_version = live.version;
            self.last_snapshot = Some(live.snapshot.clone());
            self.last_event = live.events.back().map(|e| e.seq).or(self.last_event);
            return shared;
        }
        let peaks = live.peaks_since(self.last_version);
        let new = live.snapshot.clone();
        let first_unsent = self.last_event.map_or(0, |s| s + 1);
        let fresh = live.events.iter().filter(|e| e.seq >= first_unsent);
        let progress = live.progress.as_ref().map(|(id, p)| (*id, p));
        let old = self.last_snapshot.as_deref().unwrap_or(&*new);
        let messages = update(progress, (old, &*new), peaks, fresh, first_unsent);
        self.last_version = live.version;
        drop(live);
        if let Some(last) = vramlab_shared::protocol::session::last_event(&messages) {
            self.last_event = Some(last);
        }
        self.last_snapshot = Some(new);
        messages.iter().map(wire).collect()
    }
}

/// The `id` of a message that is JSON but not a valid client message.
fn message_id(text: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()?
        .get("id")?
        .as_u64()
}

/// Handles one client message; returns the direct replies (a batch of
/// commands may have one for each of its commands).
fn handle(
    text: &str,
    max: usize,
    role: Role,
    session: &Session,
    client: &mut ClientState,
    state: &AppState,
) -> Vec<Wire> {
    if text.len() > max {
        Metrics::inc(&state.sessions.metrics.refused.too_large);
        return vec![error_msg(
            None,
            ConnectionErrorKind::TooLarge,
            format!(
                "a message of {} bytes exceeds the limit of {max} bytes",
                text.len()
            ),
        )];
    }
    let msg = match parse_client_message(text) {
        Ok(m) => m,
        Err(e) => {
            // The id, when the message has one, lets the client match it.
            let id = message_id(text);
            return vec![wire(&ServerMessage::Error { id, error: e })];
        }
    };
    let reply = match msg {
        ClientMessage::Ping { nonce } => Some(wire(&ServerMessage::Pong { nonce })),
        ClientMessage::Subscribe {} => {
            client.subscribed = true;
            Some(client.full_snapshot(session))
        }
        ClientMessage::Unsubscribe {} => {
            client.subscribed = false;
            None
        }
        ClientMessage::Snapshot {} | ClientMessage::ExportSnapshot {} if !session.allow(role) => {
            Metrics::inc(&state.sessions.metrics.refused.rate_limited);
            Some(error_msg(
                None,
                ConnectionErrorKind::RateLimited,
                match role {
                    Role::Owner => "snapshot requests count against the session's commands a second: try again shortly",
                    Role::Watcher => "the watchers' snapshot requests share a budget of the session's commands a second: try again shortly",
                },
            ))
        }
        ClientMessage::Snapshot {} => Some(client.full_snapshot(session)),
        ClientMessage::ExportSnapshot {} => {
            client.export_asked = true;
            None
        }
        ClientMessage::Command { id, .. } if role == Role::Watcher => Some(read_only(Some(id))),
        ClientMessage::Commands { first_id, commands } if role == Role::Watcher => {
            return ids(first_id, commands.len())
                .map(|id| read_only(Some(id)))
                .collect()
        }
        ClientMessage::Stop {} | ClientMessage::Presenter { .. } if role == Role::Watcher => {
            Some(read_only(None))
        }
        ClientMessage::Presenter { view } => session
            .present(view)
            .err()
            .map(|error| wire(&ServerMessage::Error { id: None, error })),
        ClientMessage::Stop {} => {
            session.stop();
            None
        }
        ClientMessage::Command { id, command } => {
            return submit(session, role, state, vec![(id, command)])
        }
        ClientMessage::Commands { first_id, commands } => {
            let numbered = ids(first_id, commands.len()).zip(commands.into_iter().map(Box::new));
            return submit(session, role, state, numbered.collect());
        }
    };
    reply.into_iter().collect()
}

/// The ids of a batch: `first`, `first + 1`, … (the reader refuses a
/// batch whose ids run past `u64::MAX`).
fn ids(first: u64, n: usize) -> impl Iterator<Item = u64> {
    (0..n as u64).map(move |i| first.saturating_add(i))
}

/// Runs commands sent in one message: the message counts once against the
/// session's commands a second; each command is queued (or refused) as if
/// sent alone. The errors, one per command refused.
fn submit(
    session: &Session,
    role: Role,
    state: &AppState,
    commands: Vec<(u64, Box<CommandLine>)>,
) -> Vec<Wire> {
    if !session.allow(role) {
        Metrics::inc(&state.sessions.metrics.refused.rate_limited);
        let why = format!(
            "more than {} commands a second: this one was not run",
            state.limits.commands_per_second
        );
        return commands
            .iter()
            .map(|(id, _)| error_msg(Some(*id), ConnectionErrorKind::RateLimited, why.clone()))
            .collect();
    }
    commands
        .into_iter()
        .filter_map(|(id, command)| {
            let error = session.submit(id, command).err()?;
            Some(wire(&ServerMessage::Error {
                id: Some(id),
                error,
            }))
        })
        .collect()
}

/// The session as a PyTorch memory snapshot: its segments now and every
/// event the session keeps.
fn export(session: &Session) -> Wire {
    let live = session.live();
    let mut snapshot = (*live.snapshot).clone();
    snapshot.events = live.events.iter().cloned().collect();
    drop(live);
    wire(&ServerMessage::MemorySnapshot {
        snapshot: Box::new(export::from_session(&snapshot)),
    })
}

fn read_only(id: Option<u64>) -> Wire {
    error_msg(
        id,
        ConnectionErrorKind::ReadOnly,
        "this connection watches the session read-only: it cannot send commands",
    )
}

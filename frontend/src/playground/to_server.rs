//! Moving the page's own session to the server (so others can watch it, or
//! to run on the server's GPU): the command lines the engine in the page
//! ran are kept, carried across the reload in sessionStorage, and replayed
//! on the server's fresh session one after another.

use crate::playground::socket;
use std::cell::RefCell;
use vramlab_shared::command::{parse_value, CommandLine};

const MOVE_KEY: &str = "vramlab_move";

thread_local! {
    /// Every line sent to the engine in the page, with its command id.
    static RAN: RefCell<Vec<(u64, serde_json::Value)>> = const { RefCell::new(Vec::new()) };
}

/// The engine in the page was sent this line as command `id`.
pub fn ran(id: u64, line: &CommandLine) {
    RAN.with(|r| r.borrow_mut().push((id, line.clone().into())));
}

/// Command `id` was stopped after `steps`: it replays as the steps it ran.
pub fn stopped(id: u64, steps: u64) {
    RAN.with(|r| {
        if let Some((_, line)) = r.borrow_mut().iter_mut().find(|(i, _)| *i == id) {
            vramlab_shared::protocol::local::as_run(line, steps);
        }
    });
}

/// The lines sent before command `id`, and those from it on.
pub fn split_at(id: u64) -> (Vec<serde_json::Value>, Vec<(u64, serde_json::Value)>) {
    RAN.with(|r| {
        let r = r.borrow();
        let at = r.iter().position(|(i, _)| *i >= id).unwrap_or(r.len());
        let before = r[..at].iter().map(|(_, line)| line.clone()).collect();
        (before, r[at..].to_vec())
    })
}

fn storage() -> Option<web_sys::Storage> {
    web_sys::window()?.session_storage().ok()?
}

/// Moves the session to the server when one answers at this address
/// (its `healthz`); otherwise says so, and the session stays in the page
/// (a static host has no server).
pub fn start_if_served(banner: leptos::prelude::RwSignal<Option<String>>) {
    use leptos::prelude::Set;
    wasm_bindgen_futures::spawn_local(async move {
        let health = crate::files::fetch_text("healthz")
            .await
            .unwrap_or_default();
        let served =
            serde_json::from_str::<serde_json::Value>(&health).is_ok_and(|h| h["status"] == "ok");
        if served {
            start();
        } else {
            let why = "No vramlab server answers at this address (nothing at /healthz): the session stays in this page.";
            banner.set(Some(why.into()));
        }
    });
}

/// Keeps the lines for the next page and loads it on the server.
pub fn start() {
    let lines = RAN.with(|r| r.borrow().iter().map(|(_, line)| line.clone()).collect());
    let lines = serde_json::Value::Array(lines);
    if let Some(s) = storage() {
        let _ = s.set_item(MOVE_KEY, &lines.to_string());
    }
    socket::forget_session();
    crate::playground::url::switch_engine("server");
}

/// The lines a move brought to this page (taken: a reload does not replay
/// them twice).
pub fn take() -> Vec<CommandLine> {
    let Some(s) = storage() else {
        return Vec::new();
    };
    let text = s.get_item(MOVE_KEY).ok().flatten();
    let _ = s.remove_item(MOVE_KEY);
    match text.and_then(|t| serde_json::from_str::<Vec<serde_json::Value>>(&t).ok()) {
        Some(lines) => lines.into_iter().map(parse_value).collect(),
        None => Vec::new(),
    }
}

/// A move under way: the lines still to replay, how many there were, and
/// the id of the one the server is running.
#[derive(Clone, Debug, Default)]
pub struct Move {
    pub left: std::collections::VecDeque<CommandLine>,
    pub total: usize,
    pub in_flight: Option<u64>,
}

impl Move {
    /// What the page says while it replays, and once it is done.
    pub fn words(&self) -> String {
        let done = self.total - self.left.len();
        if self.left.is_empty() && self.in_flight.is_none() {
            format!("Moved to the server: the {done} commands this page ran were replayed there; the watch link is in the status bar.")
        } else {
            format!(
                "Moving this session to the server: {done} of {} commands replayed…",
                self.total
            )
        }
    }
}

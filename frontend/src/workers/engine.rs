//! The engine's side of the engine in the page: in a Web Worker that loads
//! the engine's wasm (`bin/vramlab-engine.rs`), a `LocalSession` answers the page's messages
//! with the messages a server would send. A worker named [`RESUME`] starts
//! from its first message instead (`conn::restart_page`, `stopping`).

use serde_json::Value;
use std::cell::RefCell;
use vramlab_shared::command::parse_value;
use vramlab_shared::protocol::local::{LocalSession, Outlet, Stopped};
use vramlab_shared::protocol::ServerMessage;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

/// The name of a worker that resumes a session a page stopped.
pub const RESUME: &str = "resume";

thread_local! {
    static SESSION: RefCell<Option<LocalSession>> = const { RefCell::new(None) };
}

fn scope() -> DedicatedWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

fn post(msg: &ServerMessage) {
    if let Ok(text) = serde_json::to_string(msg) {
        let _ = scope().post_message(&JsValue::from_str(&text));
    }
}

fn now_ms() -> f64 {
    js_sys::Date::now()
}

const OUTLET: Outlet = Outlet { post, now_ms };

/// Answers one message: the first of a resuming worker starts its session.
fn receive(text: &str) {
    SESSION.with(|s| {
        let mut s = s.borrow_mut();
        match s.as_mut() {
            Some(session) => session.handle(text),
            None => *s = Some(resume(text)),
        }
    });
}

/// `{"lines": [...], "stopped": {"id", "line", "after_steps"}}`, as
/// `stopping::stop` writes it.
fn resume(text: &str) -> LocalSession {
    let mut v: Value = serde_json::from_str(text).unwrap_or_default();
    let lines: Vec<_> = match v["lines"].take() {
        Value::Array(lines) => lines.into_iter().map(parse_value).collect(),
        _ => Vec::new(),
    };
    let s = &mut v["stopped"];
    let stopped = s["id"].as_u64().map(|id| Stopped {
        id,
        after_steps: s["after_steps"].as_u64().unwrap_or(1),
        line: parse_value(s["line"].take()),
    });
    LocalSession::resume(OUTLET, &lines, stopped)
}

/// Starts the session (its hello and first snapshot go to the page), or
/// waits for the first message of a resuming worker, and answers every
/// message after it, one at a time: first those that came while the wasm
/// loaded.
pub fn run(early: js_sys::Array) {
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(|e: MessageEvent| {
        if let Some(text) = e.data().as_string() {
            receive(&text);
        }
    });
    scope().set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    if scope().name() != RESUME {
        let session = LocalSession::start(OUTLET);
        SESSION.with(|s| *s.borrow_mut() = Some(session));
    }
    for message in early.iter() {
        if let Some(text) = message.as_string() {
            receive(&text);
        }
    }
}

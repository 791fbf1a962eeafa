//! The engine's side of the engine in the page: in a Web Worker that loads
//! the same wasm as the page, a `LocalSession` answers the page's messages
//! with the messages a server would send.

use std::cell::RefCell;
use vramlab_shared::protocol::local::{LocalSession, Outlet};
use vramlab_shared::protocol::ServerMessage;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

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

/// Starts the session (its hello and first snapshot go to the page) and
/// answers every message after it, one at a time.
pub fn run() {
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(|e: MessageEvent| {
        if let Some(text) = e.data().as_string() {
            SESSION.with(|s| {
                if let Some(session) = s.borrow_mut().as_mut() {
                    session.handle(&text);
                }
            });
        }
    });
    scope().set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let session = LocalSession::start(Outlet { post, now_ms });
    SESSION.with(|s| *s.borrow_mut() = Some(session));
}

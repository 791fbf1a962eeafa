//! Where the page's messages go (the server's websocket, or the engine's
//! worker in the page) and the session id kept in sessionStorage: the lowest
//! layer of the page, which every other module may use to send typed
//! messages without knowing which of the two it talks to.

use std::cell::RefCell;
use vramlab_shared::protocol::ClientMessage;
use wasm_bindgen::JsValue;
use web_sys::{WebSocket, Worker};

const SESSION_KEY: &str = "vramlab_session";

/// The other end of the protocol.
pub enum Link {
    Server(WebSocket),
    /// The engine in a Web Worker of this page; `ready` once it said hello.
    Page {
        worker: Worker,
        ready: bool,
    },
}

thread_local! {
    static LINK: RefCell<Option<Link>> = const { RefCell::new(None) };
}

fn storage() -> Option<web_sys::Storage> {
    web_sys::window()?.session_storage().ok()?
}

pub fn remember_session(id: &str) {
    if let Some(s) = storage() {
        let _ = s.set_item(SESSION_KEY, id);
    }
}

pub fn forget_session() {
    if let Some(s) = storage() {
        let _ = s.remove_item(SESSION_KEY);
    }
}

pub fn stored_session() -> Option<String> {
    storage()?.get_item(SESSION_KEY).ok()?
}

/// Sends a client message if the socket is open.
pub fn send(msg: &ClientMessage) {
    if let Ok(text) = serde_json::to_string(msg) {
        send_text(&text);
    }
}

fn send_text(text: &str) {
    LINK.with(|l| match l.borrow().as_ref() {
        Some(Link::Server(ws)) if ws.ready_state() == WebSocket::OPEN => {
            let _ = ws.send_with_str(text);
        }
        Some(Link::Page {
            worker,
            ready: true,
        }) => {
            let _ = worker.post_message(&JsValue::from_str(text));
        }
        _ => {}
    });
}

/// Makes `link` where messages go (the one before it is dropped).
pub fn set(link: Link) {
    LINK.with(|l| *l.borrow_mut() = Some(link));
}

/// The engine in the page said hello: messages may go to it now.
pub fn page_ready() {
    LINK.with(|l| {
        if let Some(Link::Page { ready, .. }) = l.borrow_mut().as_mut() {
            *ready = true;
        }
    });
}

/// Ends the engine in this page, if it runs one (a busy worker stops at
/// once).
pub fn end_page() {
    LINK.with(|l| {
        if let Some(Link::Page { worker, .. }) = l.borrow_mut().take() {
            worker.terminate();
        }
    });
}

/// Whether messages go to the engine in this page.
pub fn is_page() -> bool {
    LINK.with(|l| matches!(l.borrow().as_ref(), Some(Link::Page { .. })))
}

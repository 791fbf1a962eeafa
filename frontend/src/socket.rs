//! The socket and the session id kept in sessionStorage: the lowest layer
//! of the page, which every other module may use to send typed messages.

use std::cell::RefCell;
use vramlab_shared::protocol::ClientMessage;
use web_sys::WebSocket;

const SESSION_KEY: &str = "vramlab_session";

thread_local! {
    static SOCKET: RefCell<Option<WebSocket>> = const { RefCell::new(None) };
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
    SOCKET.with(|s| {
        if let Some(ws) = s.borrow().as_ref() {
            if ws.ready_state() == WebSocket::OPEN {
                let _ = ws.send_with_str(text);
            }
        }
    });
}

/// Makes `ws` the socket messages go to.
pub fn set(ws: WebSocket) {
    SOCKET.with(|s| *s.borrow_mut() = Some(ws));
}

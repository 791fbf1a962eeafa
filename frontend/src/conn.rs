//! The websocket to the server: connects (resuming the session kept in
//! sessionStorage, or watching one), hands every message to the app, and
//! reconnects on its own when the connection drops.

use crate::state::{App, Status};
use leptos::prelude::*;
use std::cell::RefCell;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{CloseEvent, MessageEvent, WebSocket};

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

fn stored_session() -> Option<String> {
    storage()?.get_item(SESSION_KEY).ok()?
}

/// Sends a text message if the socket is open.
pub fn send(text: &str) {
    SOCKET.with(|s| {
        if let Some(ws) = s.borrow().as_ref() {
            if ws.ready_state() == WebSocket::OPEN {
                let _ = ws.send_with_str(text);
            }
        }
    });
}

fn url(watch: Option<&str>) -> Option<String> {
    let location = web_sys::window()?.location();
    let scheme = if location.protocol().ok()? == "https:" {
        "wss"
    } else {
        "ws"
    };
    let host = location.host().ok()?;
    let query = match (watch, stored_session()) {
        (Some(w), _) => format!("?watch={w}"),
        (None, Some(s)) => format!("?session={s}"),
        (None, None) => String::new(),
    };
    Some(format!("{scheme}://{host}/ws{query}"))
}

/// Opens the connection; on close, tries again after a second.
pub fn connect(app: App, watch: Option<String>) {
    let Some(url) = url(watch.as_deref()) else {
        app.status.set(Status::Closed("no window".into()));
        return;
    };
    app.status.set(Status::Connecting);
    let ws = match WebSocket::new(&url) {
        Ok(ws) => ws,
        Err(_) => {
            app.status
                .set(Status::Closed("cannot open a websocket".into()));
            return;
        }
    };
    let on_open = Closure::<dyn FnMut()>::new(move || app.status.set(Status::Open));
    ws.set_onopen(Some(on_open.as_ref().unchecked_ref()));
    on_open.forget();
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
        if let Some(text) = e.data().as_string() {
            app.handle(&text);
        }
    });
    ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let on_close = Closure::<dyn FnMut(CloseEvent)>::new(move |_e: CloseEvent| {
        app.status
            .set(Status::Closed("connection lost; reconnecting".into()));
        let watch = watch.clone();
        let retry = Closure::once_into_js(move || connect(app, watch));
        if let Some(w) = web_sys::window() {
            let _ = w
                .set_timeout_with_callback_and_timeout_and_arguments_0(retry.unchecked_ref(), 1000);
        }
    });
    ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
    on_close.forget();
    SOCKET.with(|s| *s.borrow_mut() = Some(ws));
}

//! The websocket to the server: connects (resuming the session kept in
//! sessionStorage, or watching one), hands every message to the app, and
//! reconnects on its own when the connection drops.

use crate::socket;
use crate::state::{App, Status};
use leptos::prelude::*;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{CloseEvent, MessageEvent, WebSocket};

fn url(watch: Option<&str>) -> Option<String> {
    let location = web_sys::window()?.location();
    let scheme = if location.protocol().ok()? == "https:" {
        "wss"
    } else {
        "ws"
    };
    let host = location.host().ok()?;
    let query = match (watch, socket::stored_session()) {
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
    socket::set(ws);
}

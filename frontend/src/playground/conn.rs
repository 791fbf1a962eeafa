//! Connects the page to an engine: the server's websocket (resuming the
//! session kept in sessionStorage, or watching one; reconnecting on its own
//! when the connection drops), or the engine in this page, in a Web Worker
//! running the engine's wasm (`worker`). Automatic: the server when one answers,
//! else the page. Either way every message goes to `App::handle`.

use crate::playground::socket::{self, Link};
use crate::playground::state::{App, Status};
use crate::playground::url::EngineChoice;
use leptos::prelude::*;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{CloseEvent, ErrorEvent, MessageEvent, WebSocket, Worker, WorkerOptions, WorkerType};

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

/// Connects as `choice` says; watching a session always needs the server.
pub fn connect(app: App, watch: Option<String>, choice: EngineChoice) {
    match choice {
        EngineChoice::Page if watch.is_none() => start_page(app, false),
        EngineChoice::Auto => connect_server(app, watch, true),
        _ => connect_server(app, watch, false),
    }
}

/// Opens the websocket; on close, tries again after a second, or (when
/// `fallback` and it never opened) starts the engine in the page.
fn connect_server(app: App, watch: Option<String>, fallback: bool) {
    let Some(url) = url(watch.as_deref()) else {
        app.link.status.set(Status::Closed("no window".into()));
        return;
    };
    app.link.status.set(Status::Connecting);
    let ws = match WebSocket::new(&url) {
        Ok(ws) => ws,
        Err(_) if fallback => return start_page(app, true),
        Err(_) => {
            app.link
                .status
                .set(Status::Closed("cannot open a websocket".into()));
            return;
        }
    };
    let on_open = Closure::<dyn FnMut()>::new(move || app.link.status.set(Status::Open));
    ws.set_onopen(Some(on_open.as_ref().unchecked_ref()));
    on_open.forget();
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
        if let Some(text) = e.data().as_string() {
            app.handle(&text);
            crate::playground::pyworker::drain(app);
        }
    });
    ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let on_close = Closure::<dyn FnMut(CloseEvent)>::new(move |_e: CloseEvent| {
        let opened = app.link.status.get_untracked() == Status::Open;
        if fallback && !opened && !socket::is_page() {
            return start_page(app, true);
        }
        app.link
            .status
            .set(Status::Closed("connection lost; reconnecting".into()));
        let watch = watch.clone();
        leptos::prelude::set_timeout(
            move || connect_server(app, watch, false),
            std::time::Duration::from_secs(1),
        );
    });
    ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
    on_close.forget();
    socket::set(Link::Server(ws));
}

/// The worker script the build names in the page (`<meta name="vramlab-worker">`).
fn worker_script() -> Option<String> {
    web_sys::window()?
        .document()?
        .query_selector("meta[name=vramlab-worker]")
        .ok()??
        .get_attribute("content")
}

/// Starts the engine in a Web Worker of this page; `fallback`: because no
/// server answered.
fn start_page(app: App, fallback: bool) {
    if let Some(worker) = page_worker(app, fallback, None) {
        app.link.status.set(Status::Connecting);
        socket::set(Link::Page {
            worker,
            ready: false,
        });
    }
}

/// Ends the engine in this page and starts a new one from `resume` (what
/// `worker::run` reads: the lines to replay and the command to stop).
pub fn restart_page(app: App, resume: &str) {
    socket::end_page();
    let fallback = matches!(
        app.link.status.get_untracked(),
        Status::Page { fallback: true }
    );
    let Some(worker) = page_worker(app, fallback, Some(resume)) else {
        return;
    };
    // The worker keeps what comes before it listens (`scripts/build-web`).
    let _ = worker.post_message(&JsValue::from_str(resume));
    socket::set(Link::Page {
        worker,
        ready: true,
    });
}

/// A worker running the page's engine, its messages going to `App::handle`;
/// named `resume` when it starts from a message (see `restart_page`).
fn page_worker(app: App, fallback: bool, resume: Option<&str>) -> Option<Worker> {
    let failed = |why: String| app.link.status.set(Status::Closed(why));
    let Some(script) = worker_script() else {
        failed("this build of the page has no engine of its own; it needs its server".into());
        return None;
    };
    let options = WorkerOptions::new();
    options.set_type(WorkerType::Module);
    if resume.is_some() {
        options.set_name(crate::workers::engine::RESUME);
    }
    let Ok(worker) = Worker::new_with_options(&script, &options) else {
        failed("this browser cannot start the engine in the page".into());
        return None;
    };
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
        if let Some(text) = e.data().as_string() {
            if !matches!(app.link.status.get_untracked(), Status::Page { .. }) {
                socket::page_ready();
                app.link.status.set(Status::Page { fallback });
            }
            app.handle(&text);
            crate::playground::pyworker::drain(app);
        }
    });
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let on_error = Closure::<dyn FnMut(ErrorEvent)>::new(move |e: ErrorEvent| {
        app.link.status.set(Status::Closed(format!(
            "the engine in this page stopped: {}; reload the page",
            e.message()
        )));
    });
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    Some(worker)
}

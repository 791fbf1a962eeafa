//! The page's side of the cell's Python: the worker that runs CPython
//! (Pyodide, loaded the first time the cell runs), what it says (the
//! statements, what each prints, the lines it ran), and the lines sent on
//! to the session at a pace it accepts.

use crate::state::App;
use leptos::prelude::*;
use serde_json::Value;
use std::cell::RefCell;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{ErrorEvent, MessageEvent, Worker, WorkerOptions, WorkerType};

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// At most this many of the cell's commands wait for their result.
const IN_FLIGHT: usize = 16;

/// Sends `message` to the Python worker, starting it first.
pub fn post(app: App, message: &Value) -> Result<(), String> {
    let worker = WORKER.with(|w| w.borrow().clone());
    let worker = match worker {
        Some(w) => w,
        None => start(app)?,
    };
    worker
        .post_message(&JsValue::from_str(&message.to_string()))
        .map_err(|_| "the cell's Python could not be reached".to_string())
}

fn script() -> Option<String> {
    web_sys::window()?
        .document()?
        .query_selector("meta[name=vramlab-python]")
        .ok()??
        .get_attribute("content")
}

fn start(app: App) -> Result<Worker, String> {
    let script = script().ok_or("this build of the page has no Python")?;
    let options = WorkerOptions::new();
    options.set_type(WorkerType::Module);
    let worker = Worker::new_with_options(&script, &options)
        .map_err(|_| "this browser cannot start the cell's Python")?;
    app.cell.busy.set(Some("Loading Python…".into()));
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
        if let Some(text) = e.data().as_string() {
            receive(app, &text);
        }
    });
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let on_error = Closure::<dyn FnMut(ErrorEvent)>::new(move |e: ErrorEvent| {
        app.cell.busy.set(None);
        app.cell
            .error
            .set(Some(format!("The cell's Python stopped: {}", e.message())));
        WORKER.with(|w| *w.borrow_mut() = None);
    });
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    WORKER.with(|w| *w.borrow_mut() = Some(worker.clone()));
    Ok(worker)
}

/// One message from the worker.
fn receive(app: App, text: &str) {
    let Ok(m) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let cell = app.cell;
    if let Some(p) = m["progress"].as_str() {
        cell.busy.set(Some(p.to_string()));
    } else if let Some(spans) = m["statements"].as_array() {
        let spans: Vec<(usize, usize)> = spans.iter().map(|s| (num(&s[0]), num(&s[1]))).collect();
        cell.statements(&spans);
        let framework = serde_json::from_value(m["framework"].clone());
        let framework = framework.unwrap_or_else(|_| app.framework());
        if let Some(id) = app.submit(crate::cell::restart(framework)) {
            cell.sent(None, id);
        }
    } else if let Some(e) = m.get("syntax_error") {
        cell.busy.set(None);
        cell.error.set(Some(format!(
            "line {}: {}",
            num(&e["line"]),
            e["message"].as_str().unwrap_or("")
        )));
    } else if let Some(i) = m["begin"].as_u64() {
        cell.busy.set(None);
        cell.begin(i as usize);
    } else if let Some(line) = m["line"].as_str() {
        cell.queue_line(line.to_string());
        drain(app);
    } else if let Some(t) = m["print"].as_str() {
        cell.print(t);
    } else if let Some(i) = m["end"].as_u64() {
        let error = m["error"]["text"].as_str().map(str::to_string);
        cell.end(i as usize, error);
    } else if let Some(next) = m["idle"].as_u64() {
        cell.next.set(next as usize);
        cell.busy.set(None);
    }
}

fn num(v: &Value) -> usize {
    v.as_u64().unwrap_or(0) as usize
}

/// Sends the cell's waiting lines to the session while few wait for
/// their results (the server's rate limit, the page's engine's queue);
/// called again as results come.
pub fn drain(app: App) {
    let cell = app.cell;
    while cell.queued() > 0 && app.pending_ids().len() < IN_FLIGHT {
        let Some((i, line)) = cell.next_line() else {
            return;
        };
        if let Some(id) = app.submit(line) {
            cell.sent(Some(i), id);
        }
    }
}

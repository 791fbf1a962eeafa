//! A snapshot file read for the page by a worker of its own (`reader`):
//! the page hands it the file, says how far it has read, takes the
//! snapshot back as one buffer and ends the worker, whose memory goes
//! with it. The page stays free while a large file is read.

use crate::clock::{after_paint, now_ms};
use leptos::prelude::*;
use std::cell::RefCell;
use std::rc::Rc;
use vramlab_shared::torch_snapshot::{wire, MemorySnapshot};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{ErrorEvent, MessageEvent, Worker, WorkerOptions, WorkerType};

/// What is read: the file's name and size, and its snapshot or why not.
pub struct Done {
    pub name: String,
    pub bytes: usize,
    pub snapshot: Result<MemorySnapshot, String>,
    /// When the reading started (`clock::now_ms`).
    pub started: f64,
}

/// What the reading hands on: the snapshot, or why not.
type Then = Box<dyn FnOnce(Result<MemorySnapshot, String>)>;

/// The worker's message and error handlers.
type Handlers = (
    Closure<dyn FnMut(MessageEvent)>,
    Closure<dyn FnMut(ErrorEvent)>,
);

/// One file being read: its worker, the handlers the worker calls, and
/// what is done with what it reads (once).
struct Reading {
    worker: Worker,
    handlers: Option<Handlers>,
    then: Option<Then>,
}

impl Reading {
    /// Ends the worker, the memory its reading took with it (its handlers
    /// go once the one running has returned); what to hand the result to,
    /// the first time.
    fn stop(&mut self) -> Option<Then> {
        self.worker.terminate();
        let handlers = self.handlers.take();
        leptos::prelude::set_timeout(move || drop(handlers), std::time::Duration::ZERO);
        self.then.take()
    }
}

/// Stops the reading and says why it failed.
fn fail(reading: &RefCell<Reading>, progress: RwSignal<Option<String>>, why: String) {
    progress.set(None);
    let then = reading.borrow_mut().stop();
    if let Some(then) = then {
        then(Err(why));
    }
}

/// Reads `file` in a worker, saying how far in `progress`, then hands it
/// to `then`.
pub fn read_snapshot(
    file: web_sys::File,
    progress: RwSignal<Option<String>>,
    then: impl FnOnce(Done) + 'static,
) {
    let started = now_ms();
    let (name, total) = (file.name(), file.size());
    let then: Then = {
        let name = name.clone();
        Box::new(move |snapshot| {
            then(Done {
                name,
                bytes: total as usize,
                snapshot,
                started,
            })
        })
    };
    let worker = match start_worker() {
        Ok(worker) => worker,
        Err(why) => return then(Err(why)),
    };
    let reading = Rc::new(RefCell::new(Reading {
        worker: worker.clone(),
        handlers: None,
        then: Some(then),
    }));
    let on_message = {
        let reading = reading.clone();
        Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
            let data = e.data();
            if let Some(text) = data.as_string() {
                return match said(&text, &name, total) {
                    Said::Progress(line) => progress.set(Some(line)),
                    Said::Error(why) => fail(&reading, progress, why),
                };
            }
            let Ok(buffer) = data.dyn_into::<js_sys::ArrayBuffer>() else {
                return;
            };
            // The worker goes at once, before the page decodes the buffer.
            let Some(then) = reading.borrow_mut().stop() else {
                return;
            };
            progress.set(Some(format!("Replaying {name} ({:.0} MB)…", total / 1e6)));
            after_paint(move || {
                let bytes = js_sys::Uint8Array::new(&buffer).to_vec();
                drop(buffer);
                let snapshot = wire::decode(&bytes).map_err(|e| e.to_string());
                drop(bytes);
                then(snapshot);
                progress.set(None);
            });
        })
    };
    let on_error = {
        let reading = reading.clone();
        Closure::<dyn FnMut(ErrorEvent)>::new(move |e: ErrorEvent| {
            let why = format!("the page's reader stopped: {}", e.message());
            fail(&reading, progress, why);
        })
    };
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    reading.borrow_mut().handlers = Some((on_message, on_error));
    if worker.post_message(&file).is_err() {
        let why = "the page could not hand the file to its reader".to_string();
        fail(&reading, progress, why);
    }
}

/// A worker running the reader, from the script the build names in the
/// page (`<meta name="vramlab-reader">`).
fn start_worker() -> Result<Worker, String> {
    let script = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.query_selector("meta[name=vramlab-reader]").ok()?)
        .and_then(|m| m.get_attribute("content"))
        .ok_or("this build of the page has no reader of its own")?;
    let options = WorkerOptions::new();
    options.set_type(WorkerType::Module);
    Worker::new_with_options(&script, &options)
        .map_err(|_| "this browser cannot start the page's reader".to_string())
}

/// What one of the reader's messages says.
enum Said {
    Progress(String),
    Error(String),
}

fn said(text: &str, name: &str, total: f64) -> Said {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    if let Some(why) = v["error"].as_str() {
        return Said::Error(why.to_string());
    }
    let read = v["read"].as_f64().unwrap_or(0.0);
    let pass = match v["pass"].as_str() {
        Some("first") => ", first pass",
        _ => "",
    };
    Said::Progress(format!(
        "Reading {name}{pass}: {:.0} of {:.0} MB",
        read / 1e6,
        total / 1e6
    ))
}

//! The page's side of the cell's Python: the worker that runs CPython
//! (Pyodide, loaded the first time the cell runs), what it says (the
//! statements, what each prints, the lines it ran), and the lines sent on
//! to the session at a pace it accepts.

use crate::playground::state::App;
use leptos::prelude::*;
use std::cell::RefCell;
use vramlab_shared::protocol::python_worker::{FromPython, Stream, ToPython};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{ErrorEvent, MessageEvent, Worker, WorkerOptions, WorkerType};

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
    /// Which worker is the current one (a stopped one's last words are
    /// not heard).
    static GENERATION: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Python is running statements (asked to step, not yet idle).
    static RUNNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// At most this many of the cell's commands wait for their result.
const IN_FLIGHT: usize = 16;

/// Sends `message` to the Python worker, starting it first.
pub fn post(app: App, message: &ToPython) -> Result<(), String> {
    let worker = WORKER.with(|w| w.borrow().clone());
    let worker = match worker {
        Some(w) => w,
        None => start(app)?,
    };
    if let ToPython::Step { .. } = message {
        RUNNING.with(|r| r.set(true));
    }
    let text = serde_json::to_string(message).unwrap_or_default();
    worker
        .post_message(&JsValue::from_str(&text))
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
    app.cell
        .busy
        .set(Some("Loading Python (about 5.5 MB, once)…".into()));
    let generation = GENERATION.with(|g| g.get() + 1);
    GENERATION.with(|g| g.set(generation));
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
        let current = GENERATION.with(|g| g.get()) == generation;
        if let Some(text) = e.data().as_string().filter(|_| current) {
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

/// One message from the worker (one of another shape is not heard).
fn receive(app: App, text: &str) {
    let Some(m) = serde_json::from_str(text)
        .ok()
        .and_then(FromPython::from_json)
    else {
        return;
    };
    let cell = app.cell;
    let index = |i: u64| i as usize;
    match m {
        FromPython::Loaded { bytes, ms, version } => cell.python.set(Some(format!(
            "Python {version} loaded: {:.1} MB in {:.1} s",
            bytes as f64 / 1e6,
            ms as f64 / 1e3
        ))),
        FromPython::Statements { spans, framework } => {
            let spans: Vec<(usize, usize)> = (spans.into_iter())
                .map(|(a, b)| (index(a), index(b)))
                .collect();
            cell.statements(&spans);
            if let Some(id) = app.submit(crate::playground::cell_state::restart(framework)) {
                cell.sent(None, id);
            }
        }
        FromPython::SyntaxError { line, message } => {
            cell.busy.set(None);
            cell.error.set(Some(format!("line {line}: {message}")));
        }
        FromPython::Begin { statement } => {
            cell.busy.set(None);
            cell.begin(index(statement));
        }
        FromPython::Line { line } => {
            cell.queue_line(line);
            drain(app);
        }
        FromPython::Print { text, stream, .. } => cell.print(&text, stream == Stream::Stderr),
        FromPython::End { statement, error } => {
            cell.end(index(statement), error.map(|e| e.text));
        }
        FromPython::Idle { next } => {
            RUNNING.with(|r| r.set(false));
            cell.next.set(index(next));
            cell.busy.set(None);
        }
    }
}

/// ❚❚ pause, as Jupyter's interrupt: the cell's run stops where the
/// session is (the lines not yet sent are dropped, the statement there
/// raises `KeyboardInterrupt`); Python still running is stopped (its
/// worker ended; the next run starts another). Whether a run was stopped.
pub fn interrupt(app: App) -> bool {
    let running = RUNNING.with(|r| r.replace(false));
    if running {
        if let Some(w) = WORKER.with(|w| w.borrow_mut().take()) {
            w.terminate();
        }
        GENERATION.with(|g| g.set(g.get() + 1));
    }
    app.cell.interrupt() || running
}

/// Sends the cell's waiting lines to the session while few wait for
/// their results (the page's engine's queue) and within the session's
/// commands a second (a server refuses more); called again as results
/// come, and when the rate allows the next.
pub fn drain(app: App) {
    let cell = app.cell;
    let rate = app.link.hello.with_untracked(|h| {
        h.as_ref()
            .map_or(50.0, |h| f64::from(h.limits.commands_per_second.max(1)))
    });
    loop {
        let room = IN_FLIGHT.saturating_sub(app.pending_ids().len());
        if cell.queued() == 0 || room == 0 {
            return;
        }
        if let Err(wait_ms) = BUCKET.with(|b| b.borrow_mut().take(rate, crate::clock::now_ms())) {
            later(app, wait_ms);
            return;
        }
        // One message for the lines that fit: it counts once against the
        // session's commands a second.
        let lines: Vec<_> = std::iter::from_fn(|| cell.next_line()).take(room).collect();
        let (steps, lines): (Vec<usize>, Vec<_>) = lines.into_iter().unzip();
        for (i, id) in steps.into_iter().zip(app.submit_batch(lines)) {
            if let Some(id) = id {
                cell.sent(Some(i), id);
            }
        }
    }
}

/// Drains again in `ms` (once, however many ask).
fn later(app: App, ms: f64) {
    if WAITING.with(|w| w.replace(true)) {
        return;
    }
    leptos::prelude::set_timeout(
        move || {
            WAITING.with(|w| w.set(false));
            drain(app);
        },
        std::time::Duration::from_millis(ms.ceil().max(1.0) as u64),
    );
}

thread_local! {
    static BUCKET: RefCell<Bucket> = const { RefCell::new(Bucket { tokens: 0.0, at: 0.0 }) };
    static WAITING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The cell's share of the session's commands a second: a token bucket
/// at 80% of the server's (whose bucket the buttons draw from too).
struct Bucket {
    tokens: f64,
    at: f64,
}

impl Bucket {
    /// Takes a token at `now` (ms), or says how long until one is there.
    fn take(&mut self, rate: f64, now: f64) -> Result<(), f64> {
        let rate = rate * 0.8;
        let burst = (rate / 2.0).max(1.0);
        self.tokens = (self.tokens + (now - self.at).max(0.0) * rate / 1000.0).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err((1.0 - self.tokens) * 1000.0 / rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Bucket;

    #[test]
    fn the_bucket_keeps_to_eighty_percent_of_the_rate() {
        let mut b = Bucket {
            tokens: 0.0,
            at: 0.0,
        };
        // 50 a second: 40 for the cell, bursts of 20.
        let sent = (0..=10_000)
            .filter(|ms| b.take(50.0, *ms as f64).is_ok())
            .count();
        assert!((400..=421).contains(&sent), "{sent} in 10 s");
        let mut b = Bucket {
            tokens: 0.0,
            at: 0.0,
        };
        assert_eq!(b.take(50.0, 0.0), Err(25.0));
        assert_eq!(b.take(50.0, 25.0), Ok(()));
    }
}

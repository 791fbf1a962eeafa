//! The playground's entry: the page, the engine's worker and the cell's
//! Python worker start here (the same wasm; `vramlab_frontend` is the app).

use vramlab_frontend::{python, worker, Playground};
use wasm_bindgen::prelude::wasm_bindgen;

/// The page; in the engine's worker (no window) nothing is mounted.
fn main() {
    if web_sys::window().is_some() {
        leptos::mount::mount_to_body(Playground);
    }
}

/// The entry of the engine's worker (the build's worker script calls it
/// with the messages that came while the wasm loaded).
#[wasm_bindgen]
pub fn worker_main(early: js_sys::Array) {
    worker::run(early);
}

/// Starts the Python worker's engine afresh with the session's `settings`
/// (JSON), then runs `restart`; returns its record.
#[wasm_bindgen]
pub fn python_restart(settings: &str, restart: &str) -> String {
    python::restart(settings, restart)
}

/// Runs one command line in the Python worker's engine; returns its record
/// as JSON.
#[wasm_bindgen]
pub fn python_execute(line: &str) -> String {
    python::execute(line)
}

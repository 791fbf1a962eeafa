//! The engine's wasm: what the page's workers run (the engine's worker,
//! when the page has no server, and the cell's Python worker, whose
//! statements ask it for their numbers). The page itself (`main.rs`)
//! carries no engine: with a server it never runs one.

use vramlab_frontend::workers::{engine, python};
use wasm_bindgen::prelude::wasm_bindgen;

/// Nothing to mount: a worker has no window.
fn main() {}

/// The entry of the engine's worker (the build's worker script calls it
/// with the messages that came while the wasm loaded).
#[wasm_bindgen]
pub fn worker_main(early: js_sys::Array) {
    engine::run(early);
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

//! The engine the page's Python asks (in the Python worker, beside
//! Pyodide): the same engine as the session's, started with the session's
//! settings, so each statement's numbers are there when the code reads
//! them (`torch.cuda.memory_allocated()`); the worker sends the same lines
//! to the session, which stays the one the page shows.

use std::cell::RefCell;
use vramlab_shared::engine::SimDeviceFactory;
use vramlab_shared::framework::Settings;
use vramlab_shared::Engine;

thread_local! {
    static MIRROR: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

/// Starts the engine afresh with the session's `settings` (JSON), then
/// runs `restart` (a line, naming the framework); returns its record.
pub fn restart(settings: &str, restart: &str) -> String {
    let engine = serde_json::from_str::<Settings>(settings)
        .map_err(|e| e.to_string())
        .and_then(|s| Engine::new(Box::new(SimDeviceFactory), s).map_err(|e| e.to_string()));
    match engine {
        Ok(engine) => {
            MIRROR.with(|m| *m.borrow_mut() = Some(engine));
            execute(restart)
        }
        Err(e) => {
            serde_json::json!({"ok": false, "error": {"kind": "invalid_value", "message": e}})
                .to_string()
        }
    }
}

/// Runs one command line; returns its record as JSON.
pub fn execute(line: &str) -> String {
    MIRROR.with(|m| match m.borrow_mut().as_mut() {
        Some(engine) => serde_json::to_string(&engine.run_line(line)).unwrap_or_default(),
        None => r#"{"ok":false,"error":{"kind":"runtime_error","message":"the engine has not started"}}"#.into(),
    })
}

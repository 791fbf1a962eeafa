//! "Your snapshot" (snapshots/): a PyTorch memory snapshot read and replayed
//! in the page, its own wasm so the playground's first load does not carry
//! the reader. The same wasm runs the page's reader in a worker
//! (`reader_main`), where there is no window to mount the page in.

use wasm_bindgen::prelude::*;

fn main() {
    if web_sys::window().is_some() {
        leptos::mount::mount_to_body(vramlab_frontend::SnapshotPage);
    }
}

/// The reader's worker: reads the file the page sends (those that came
/// while the wasm loaded first).
#[wasm_bindgen]
pub fn reader_main(early: js_sys::Array) {
    vramlab_frontend::workers::snapshot_reader::run(early);
}

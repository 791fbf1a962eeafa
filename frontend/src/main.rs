//! The playground's page (`vramlab_frontend` is the app). Its workers run
//! the engine's own wasm (`bin/vramlab-engine.rs`).

use vramlab_frontend::Playground;

fn main() {
    leptos::mount::mount_to_body(Playground);
}

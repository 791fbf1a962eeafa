//! "Your snapshot" (snapshots/): a PyTorch memory snapshot read and replayed
//! in the page, its own wasm so the playground's first load does not carry
//! the reader.

fn main() {
    leptos::mount::mount_to_body(vramlab_frontend::SnapshotPage);
}

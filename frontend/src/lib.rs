//! The vramlab web app: Leptos, client-side rendered, three programs built
//! from this library, each in a folder of its own:
//!
//! - [`playground`]: the playground (`Playground`, the `vramlab-frontend`
//!   binary). It talks to the server over one websocket or to the engine in
//!   a worker (`playground::conn`), keeps what it was told in
//!   `playground::state` and draws it in `playground::views`; lessons are
//!   built in (`playground::lessons`), the URL keeps what a link should
//!   reproduce (`playground::url`).
//! - [`snapshots`]: "Your snapshot" (`SnapshotPage`, the
//!   `vramlab-snapshots` binary, under snapshots/): a PyTorch memory
//!   snapshot read in a worker and replayed in the page, fetched only
//!   there, so the playground's first load does not carry it.
//! - [`workers`]: what runs in the pages' Web Workers: the engine
//!   (`workers::engine`), the engine the cell's Python asks
//!   (`workers::python`) and the snapshot reader
//!   (`workers::snapshot_reader`).
//!
//! Beside them, what all three use: the page's clock ([`clock`]) and files
//! opened, fetched or offered ([`files`]).

pub(crate) mod clock;
pub(crate) mod files;
pub mod playground;
pub mod snapshots;
pub mod workers;

pub use playground::Playground;
pub use snapshots::SnapshotPage;

/// talc instead of dlmalloc: the same single-threaded heap, a smaller
/// download.
#[cfg(all(not(target_feature = "atomics"), target_family = "wasm"))]
#[global_allocator]
static TALC: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

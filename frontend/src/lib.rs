//! The vramlab web app: Leptos, client-side rendered, two pages built from
//! this library. The playground (`Playground`, the `vramlab-frontend`
//! binary) talks to the server over one websocket or to the engine in a
//! worker of its own (`conn`, `worker`), keeps what the server said in
//! `state`, and draws it in `views`. Lessons are built in (`lessons`); the
//! URL keeps what a link should reproduce (`url`). "Your snapshot"
//! (`SnapshotPage`, the `vramlab-snapshots` binary, under snapshots/) reads a
//! PyTorch memory snapshot and replays it in the page (`replay`), fetched
//! only there, so the playground's first load does not carry it.

mod cell;
mod clock;
mod compare;
mod conn;
mod explanation;
mod files;
mod history;
mod keys;
mod lessons;
mod mirror;
mod moving;
mod play;
pub mod python;
mod pyworker;
pub mod reader;
mod reading;
mod replay;
mod socket;
mod state;
mod stopping;
mod url;
mod views;
pub mod worker;

use leptos::prelude::*;
use state::{App, LessonRun};
use views::*;

pub use views::SnapshotPage;

/// The playground page.
#[component]
pub fn Playground() -> impl IntoView {
    let app = App::new();
    let initial = url::read();
    app.link.wanted_framework.set(initial.framework);
    app.display.hidden.set(initial.hide.clone());
    if let Some((index, step)) = initial.lesson {
        app.lesson.set(Some(LessonRun::at(index, step)));
    }
    app.display.projector.set(initial.projector);
    conn::connect(app, initial.watch.clone(), initial.engine);
    keys::install();
    mirror::follow(app);
    mirror::show_presented(app);
    view! {
        <a class="skip" href="#numbers">"Skip to the numbers and the lesson"</a>
        <a class="plan" href="./plan/">"Will it fit?"</a>
        <StatusBar app=app />
        <Banner app=app />
        // The numbers come first and stay on screen (sticky), the lesson
        // right under them (on a phone, at the top; by keyboard, first);
        // the controls sit in the left column.
        <main class="grid">
            <div class="right">
                <Numbers app=app />
                <Lessons app=app />
                <Explanation app=app />
                <CodeCell app=app />
                <Timeline app=app />
                <SegmentMap app=app />
                <div class="two">
                    <Objects app=app />
                    <EventLog app=app />
                </div>
                <CodePane app=app />
            </div>
            <div class="left">
                <Controls app=app />
            </div>
        </main>
        <SnapshotLinks app=app />
    }
}

/// talc instead of dlmalloc: the same single-threaded heap, a smaller
/// download.
#[cfg(all(not(target_feature = "atomics"), target_family = "wasm"))]
#[global_allocator]
static TALC: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

//! The playground: the page that runs a session (the numbers, the lessons,
//! the code cell, the controls and the pictures), on a server's engine or
//! the one in the page's worker.

pub(crate) mod cell_state;
mod conn;
pub(crate) mod explanation;
mod history;
mod keys;
mod lessons;
mod mirror;
mod play;
mod pyworker;
pub(crate) mod socket;
pub(crate) mod state;
mod stopping;
mod to_server;
mod url;
pub(crate) mod views;

use leptos::prelude::*;
use state::{App, LessonRun};
use views::*;

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

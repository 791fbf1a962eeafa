//! Watchers see what the presenter sees: the owner's page sends its lesson
//! step, code cell and how far its run is, the Python pane, ▶ play's
//! progress, the explanation and the control values (200 ms after the last
//! change), and a watcher's page shows them. The numbers, the timeline and
//! the segment map already come to every client from the session.

use crate::playground::state::{App, Explanation, LessonRun};
use leptos::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;
use vramlab_shared::protocol::{ClientMessage, ExplanationView, PlayView, PresenterView};
use wasm_bindgen::JsCast;

/// The pause after the last change before the view is sent.
const SETTLE: Duration = Duration::from_millis(200);

/// The controls mirrored: text fields, selects and checkboxes in the
/// controls column (the framework follows the kernel itself).
const CONTROLS: &str = ".controls input, .controls select";

fn controls() -> Vec<web_sys::HtmlElement> {
    let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
        return Vec::new();
    };
    let Ok(list) = doc.query_selector_all(CONTROLS) else {
        return Vec::new();
    };
    (0..list.length())
        .filter_map(|i| list.item(i)?.dyn_into::<web_sys::HtmlElement>().ok())
        .filter(|e| e.id() != "framework")
        .collect()
}

/// A control's key: its id, or its label's words.
fn key(e: &web_sys::HtmlElement) -> String {
    if !e.id().is_empty() {
        return e.id();
    }
    let label = e.closest("label").ok().flatten();
    format!(
        "label:{}",
        label
            .and_then(|l| l.text_content())
            .unwrap_or_default()
            .trim()
    )
}

fn value(e: &web_sys::HtmlElement) -> Option<String> {
    if let Some(input) = e.dyn_ref::<web_sys::HtmlInputElement>() {
        return Some(if input.type_() == "checkbox" {
            input.checked().to_string()
        } else {
            input.value()
        });
    }
    e.dyn_ref::<web_sys::HtmlSelectElement>().map(|s| s.value())
}

/// How many of the Python pane's lines a watcher is sent.
const PANE_LINES: usize = 100;

/// What the owner's page shows now.
fn view(app: App) -> PresenterView {
    PresenterView {
        lesson: app
            .lesson
            .get_untracked()
            .map(|l| (l.index, l.step, l.outcome)),
        cell: app.cell.source.get_untracked(),
        // The pane's newest lines: a message stays small however long the
        // session.
        code: app
            .outbox
            .code
            .with_untracked(|c| c[c.len().saturating_sub(PANE_LINES)..].to_vec()),
        explanation: app
            .words
            .explanation
            .get_untracked()
            .map(|e| ExplanationView {
                moved: e.moved,
                why: e.why,
                link: e.link,
                ok: e.ok,
            }),
        controls: vramlab_shared::collections::map_of(
            controls().iter().filter_map(|e| Some((key(e), value(e)?))),
        ),
        statements: app.cell.view(),
        play: (app.play.total.get_untracked() > 0).then(|| PlayView {
            done: app.play.done.get_untracked(),
            total: app.play.total.get_untracked(),
            losses: app.play.losses.get_untracked(),
        }),
    }
}

/// On the owner's page: sends the view when it has settled after a change
/// (the lesson, the cell, a result, or a control edited).
pub fn follow(app: App) {
    let waiting = RwSignal::new(false);
    Effect::new(move |_| {
        app.lesson.track();
        app.cell.source.track();
        app.cell.steps.track();
        app.play.done.track();
        app.outbox.code.track();
        app.memory.results.track();
        app.display.control_edits.track();
        app.link.watchers.track();
        if app.read_only() || waiting.get_untracked() {
            return;
        }
        waiting.set(true);
        set_timeout(
            move || {
                waiting.set(false);
                if !app.read_only() && !app.link.watchers.with_untracked(Vec::is_empty) {
                    crate::playground::socket::send(&ClientMessage::Presenter {
                        view: Box::new(view(app)),
                    });
                }
            },
            SETTLE,
        );
    });
}

/// On a watcher's page: shows the presenter's view when one comes.
pub fn show_presented(app: App) {
    Effect::new(move |_| {
        if let Some(view) = app.link.presented.get() {
            show(app, view);
        }
    });
}

fn show(app: App, view: PresenterView) {
    app.lesson
        .set(view.lesson.map(|(index, step, outcome)| LessonRun {
            outcome,
            ..LessonRun::at(index, step)
        }));
    app.cell.source.set(view.cell);
    app.cell.mirror(&view.statements);
    if let Some(p) = view.play {
        app.play.mirror(p.done, p.total, p.losses);
    }
    app.outbox.code.set(view.code);
    if let Some(e) = view.explanation {
        app.words.explanation.set(Some(Explanation::mirrored(e)));
    }
    set_controls(&view.controls);
}

fn set_controls(values: &BTreeMap<String, String>) {
    for e in controls() {
        let Some(v) = values.get(&key(&e)) else {
            continue;
        };
        let event = if let Some(input) = e.dyn_ref::<web_sys::HtmlInputElement>() {
            if input.type_() == "checkbox" {
                input.set_checked(v == "true");
                "change"
            } else {
                input.set_value(v);
                "input"
            }
        } else if let Some(select) = e.dyn_ref::<web_sys::HtmlSelectElement>() {
            select.set_value(v);
            "change"
        } else {
            continue;
        };
        if let Ok(ev) = web_sys::Event::new_with_event_init_dict(event, &{
            let init = web_sys::EventInit::new();
            init.set_bubbles(true);
            init
        }) {
            let _ = e.dispatch_event(&ev);
        }
    }
}

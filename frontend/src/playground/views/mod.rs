//! The views: controls, the three numbers as a stacked bar, the timeline,
//! the segment map, the table of live objects, the event log, the code pane,
//! the explanation, the lessons and the way to "Your snapshot". Controls
//! send typed [`Command`] values.

mod cell;
mod generating;
mod glossary;
mod kernel;
mod lessons;
mod picture;
pub(crate) mod segments;
mod status;
mod tables;
mod timeline;
mod training;
mod your_snapshot;

pub use cell::CodeCell;
pub use kernel::Controls;
pub use lessons::Lessons;
pub use segments::SegmentMap;
pub use status::{Banner, Explanation, Numbers, StatusBar};
pub use tables::{CodePane, EventLog, Objects};
pub use timeline::Timeline;
pub use your_snapshot::SnapshotLinks;

use crate::playground::state::App;
use leptos::prelude::*;
use vramlab_shared::command::Command;
use vramlab_shared::types::Category;
use vramlab_shared::Invalid;

/// Okabe-Ito colours (distinguishable with colour-vision deficiencies).
pub fn colour(c: Category) -> &'static str {
    match c {
        Category::Parameter => "#0072b2",
        Category::Gradient => "#e69f00",
        Category::OptimizerState => "#009e73",
        Category::Activation => "#cc79a7",
        Category::Input => "#56b4e9",
        Category::Temporary => "#d55e00",
        Category::Workspace => "#f0e442",
        Category::KvCache => "#882255",
        Category::Other => "#3d3d8f",
    }
}
/// The three numbers' colours, the same in the numbers and the timeline
/// (each at least 4.5:1 on white).
pub mod colour_of {
    pub const ALLOCATED: &str = "#0072b2";
    pub const RESERVED: &str = "#8a5d00";
    pub const DEVICE: &str = "#007a5a";
}
const CACHED: &str = "#bbbbbb";
const CONTEXT: &str = "#444444";
const OTHERS: &str = "#888888";
const FREE: &str = "#f1f1ec";

/// Whether a group of controls is hidden (`?hide=` in the URL).
fn hidden(app: App, group: &'static str) -> impl Fn() -> bool {
    move || app.display.hidden.with(|h| h.iter().any(|g| g == group))
}

/// A button that runs the command `cmd` builds when clicked.
fn button(
    app: App,
    id: &'static str,
    label: &'static str,
    title: &'static str,
    cmd: impl Fn() -> Command + 'static,
) -> impl IntoView {
    checked_button(app, id, label, title, move || Ok(vec![cmd()]))
}

/// A button that runs the commands `cmds` reads from the fields, or, when
/// a field cannot be read (or the server is not connected), says why
/// beside it (`#ID-refused`) and sends nothing.
fn checked_button(
    app: App,
    id: &'static str,
    label: &'static str,
    title: &'static str,
    cmds: impl Fn() -> Result<Vec<Command>, Invalid> + 'static,
) -> impl IntoView {
    button_view(app, id, (label, None), title, Box::new(cmds))
}

/// A [`checked_button`] that, while `busy` holds (what it started is
/// under way), reads `busy_label` and cannot be pressed again.
fn busy_button(
    app: App,
    id: &'static str,
    (label, busy_label): (&'static str, &'static str),
    busy: Signal<bool>,
    title: &'static str,
    cmds: impl Fn() -> Result<Vec<Command>, Invalid> + 'static,
) -> impl IntoView {
    button_view(
        app,
        id,
        (label, Some((busy_label, busy))),
        title,
        Box::new(cmds),
    )
}

/// What [`checked_button`] draws, built once for every button (not once
/// per kind of closure: a smaller download).
fn button_view(
    app: App,
    id: &'static str,
    (label, busy): (&'static str, Option<(&'static str, Signal<bool>)>),
    title: &'static str,
    cmds: Box<dyn Fn() -> Result<Vec<Command>, Invalid>>,
) -> AnyView {
    let refused = RwSignal::new(None::<String>);
    let click = move |_| {
        if !app
            .link
            .status
            .with_untracked(crate::playground::state::Status::is_ready)
        {
            let why = "Not connected to the server: reconnecting; nothing was sent.";
            return refused.set(Some(why.into()));
        }
        match cmds() {
            Ok(cmds) => {
                refused.set(None);
                cmds.into_iter().for_each(|c| app.run(c));
            }
            Err(why) => refused.set(Some(why.0)),
        }
    };
    view! {
        <button id=id title=title on:click=click
            disabled=move || app.read_only() || busy.is_some_and(|(_, b)| b.get())
            aria-busy=move || busy.is_some_and(|(_, b)| b.get()).to_string()>
            {move || match busy {
                Some((words, b)) if b.get() => words,
                _ => label,
            }}
        </button>
        {move || refused.get().map(|why| view! {
            <span class="refused" role="alert" id=format!("{id}-refused")>{why}</span>
        })}
    }
    .into_any()
}

/// A text field bound to a signal.
pub(crate) fn text_input(
    id: &'static str,
    size: &'static str,
    placeholder: &'static str,
    value: RwSignal<String>,
) -> impl IntoView {
    view! { <input id=id size=size placeholder=placeholder prop:value=value on:input=move |e| value.set(event_target_value(&e)) /> }
}

/// A slider over the powers of two `2^low..=2^high`, for the number in
/// the text field `value` (typing there moves it; dragging it writes
/// there).
fn pow2_slider(
    id: &'static str,
    label: &'static str,
    (low, high): (u32, u32),
    value: RwSignal<String>,
) -> impl IntoView {
    let at = move || {
        let n = value.get().trim().parse::<u64>().unwrap_or(1).max(1);
        n.ilog2().clamp(low, high).to_string()
    };
    let set = move |e| {
        if let Ok(p) = event_target_value(&e).parse::<u32>() {
            value.set((1u64 << p.min(high)).to_string());
        }
    };
    view! { <input type="range" id=id aria-label=label min=low.to_string() max=high.to_string() prop:value=at on:input=set /> }
}

/// An option's value, or its text.
type Words<T> = fn(T) -> &'static str;

/// A select over `all`, bound to `value`: each option's value is `key`,
/// its text `label`.
fn choice<T>(
    id: &'static str,
    title: &'static str,
    value: RwSignal<T>,
    all: &'static [T],
    (key, label): (Words<T>, Words<T>),
) -> impl IntoView
where
    T: Copy + Send + Sync + 'static,
{
    let pick = move |e| {
        let picked = event_target_value(&e);
        if let Some(&v) = all.iter().find(|&&v| key(v) == picked) {
            value.set(v);
        }
    };
    view! {
        <select id=id title=title prop:value=move || key(value.get()) on:change=pick>
            {all.iter().map(|&v| view! { <option value=key(v)>{label(v)}</option> }).collect_view()}
        </select>
    }
}

/// A checkbox bound to a signal.
pub(crate) fn checkbox(value: RwSignal<bool>) -> impl IntoView {
    view! { <input type="checkbox" prop:checked=value on:change=move |e| value.set(event_target_checked(&e)) /> }
}

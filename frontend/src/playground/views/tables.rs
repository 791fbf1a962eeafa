//! The live objects and why each is alive, the event log, and the Python
//! each action stands for.

use crate::playground::state::App;
use leptos::prelude::*;
use vramlab_shared::units::format_size;

#[component]
pub fn Objects(app: App) -> impl IntoView {
    let rows = move || {
        app.memory.snapshot.with(|s| {
            s.as_ref()
                .map(|s| {
                    s.objects
                        .iter()
                        .filter(|o| !o.is_autograd_graph())
                        .take(300)
                        .cloned()
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
    };
    view! {
        <section class="objects" aria-label="Live objects">
            <h2>"Names and objects"</h2>
            <table id="objects">
                <thead><tr><th>"name"</th><th>"type"</th><th>"bytes"</th><th>"refs"</th><th>"kept alive by"</th></tr></thead>
                <tbody>
                    {move || rows().into_iter().map(|o| object_row(app, o)).collect::<Vec<_>>()}
                </tbody>
            </table>
        </section>
    }
}

/// One live object's row; clicking it (or Enter) selects its name.
fn object_row(app: App, o: vramlab_shared::snapshot::ObjectSnapshot) -> impl IntoView {
    let pick = o.names.first().cloned().unwrap_or_else(|| o.label.clone());
    let selected = pick.clone();
    view! {
        <tr class:selected=move || app.display.selected.get() == selected tabindex="0"
            on:click={ let pick = pick.clone(); move |_| app.display.selected.set(pick.clone()) }
            on:keydown=move |e: web_sys::KeyboardEvent| if e.key() == "Enter" || e.key() == " " { app.display.selected.set(pick.clone()) }>
            <td>{if o.names.is_empty() { format!("({})", o.label) } else { o.names.join(", ") }}</td>
            <td>{o.kind}</td>
            <td class="num">{if o.bytes > 0 { format_size(o.bytes) } else { String::new() }}</td>
            <td class="num">{o.refcount}</td>
            <td>{o.kept_alive_by}</td>
        </tr>
    }
}

#[component]
pub fn EventLog(app: App) -> impl IntoView {
    view! {
        // Scrolls once the log is long: reachable by keyboard then too.
        <section class="events" aria-label="Event log" tabindex="0">
            <h2>"Events " <small>"(#: the command that caused it)"</small></h2>
            <ul id="events">
                {move || app.memory.events.with(|q| q.iter().rev().take(40).map(|e| view! {
                    <li><code>{format!("#{} · {:?} · {} {}", e.step, e.action, format_size(e.size), e.name.clone().unwrap_or_default())}</code></li>
                }).collect::<Vec<_>>())}
            </ul>
        </section>
    }
}

#[component]
pub fn CodePane(app: App) -> impl IntoView {
    let text = move || app.outbox.code.with(|c| c.join("\n"));
    let copy = move |_| {
        if let Some(w) = web_sys::window() {
            let _ = w.navigator().clipboard().write_text(&text());
        }
    };
    view! {
        <section class="code" aria-label="The Python each action stands for">
            <h2>"Python" <button on:click=copy>"Copy"</button></h2>
            <pre id="code" tabindex="0">{text}</pre>
        </section>
    }
}

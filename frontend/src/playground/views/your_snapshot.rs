//! The playground's way to "Your snapshot" (snapshots/, a page of its own):
//! the link, this session replayed there, and this session saved as a
//! snapshot file.

use crate::playground::state::{App, ExportTo};
use leptos::prelude::*;

#[component]
pub fn SnapshotLinks(app: App) -> impl IntoView {
    let no_session = move || app.link.hello.get().is_none();
    view! {
        <section id="snapshot-links" class="snapshot" aria-label="Your snapshot">
            <h2>"Your snapshot"</h2>
            <p class="open">
                <a id="snapshot-page" href="./snapshots/">"Open a PyTorch memory snapshot"</a>
                " (recorded with "<code>"torch.cuda.memory._record_memory_history()"</code>
                "): replayed on vramlab's allocator in the page, what if, and where it ran out; nothing is uploaded. "
                <button id="btn-replay-session" disabled=no_session
                    title="This session's memory as a snapshot, opened in Your snapshot (a new tab)"
                    on:click=move |_| app.export(ExportTo::Page)>"replay this session"</button>
                " "
                <button id="btn-export" disabled=no_session
                    title="Save this session as a snapshot that pytorch.org/memory_viz opens"
                    on:click=move |_| app.export(ExportTo::Download)>"save this session as a snapshot"</button>
            </p>
        </section>
    }
}

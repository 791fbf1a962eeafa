//! "Your snapshot", a page of its own (snapshots/): open or drop a PyTorch
//! memory snapshot, see whether vramlab replays it exactly, ask what if,
//! and compare the two runs.

use super::active::ActiveChart;
use super::chart::CompareChart;
use super::compare::{DiffPanel, FixPanel, WindowForm};
use super::trace::{TraceEvents, TraceSegments};
use crate::files;
use crate::playground::views::{checkbox, text_input};
use crate::snapshots::replays::{Opened, Replays, WhatIf};
use leptos::prelude::*;
use vramlab_shared::framework::RestartSettings;
use vramlab_shared::gpu::GpuModel;
use vramlab_shared::torch_snapshot::fix::{self, first_oom_words};
use vramlab_shared::torch_snapshot::replay::recorded_ooms;
use vramlab_shared::torch_snapshot::replay::ReplayRun;
use vramlab_shared::torch_snapshot::what_if::{describe_recorded, describe_what_if};
use vramlab_shared::units::{format_size, MIB};

/// Reads the file and opens it on the page.
fn open_file(r: Replays, file: Option<web_sys::File>) {
    if let Some(file) = file {
        r.read_then(file, r.error, move |name, bytes, snapshot, started| {
            r.open_read(name, bytes, snapshot, started)
        });
    }
}

/// The playground's session, when the page was opened with one
/// (`#session=<the playground's blob: URL>`, `state::export`): read from
/// the playground's tab, then the fragment dropped (a reload opens an empty
/// page, not a URL that may be gone).
fn open_session(r: Replays) {
    let Some(window) = web_sys::window() else {
        return;
    };
    let hash = window.location().hash().unwrap_or_default();
    let Some(url) = hash.strip_prefix("#session=").map(str::to_string) else {
        return;
    };
    if let Ok(history) = window.history() {
        let _ = history.replace_state_with_url(&wasm_bindgen::JsValue::NULL, "", Some("./"));
    }
    leptos::task::spawn_local(async move {
        match files::fetch_bytes(&url).await {
            Ok(bytes) => r.open("vramlab-session.pickle".into(), bytes),
            Err(_) => r.error.set(Some(
                "The playground's session could not be read: its tab was closed or reloaded. Save the session as a snapshot there and open the file here.".into(),
            )),
        }
    });
}

/// "Your snapshot" (snapshots/): open or drop a PyTorch memory snapshot,
/// see whether vramlab replays it exactly, ask what if, and compare the
/// two runs.
#[component]
pub fn SnapshotPage() -> impl IntoView {
    let r = Replays::new();
    open_session(r);
    let on_drop = move |e: web_sys::DragEvent| {
        e.prevent_default();
        open_file(r, files::first(e.data_transfer().and_then(|d| d.files())));
    };
    view! {
        <a class="plan" href="../">"The playground"</a>
        <main id="your-snapshot" class="snapshot" aria-label="Your snapshot"
            on:dragover=|e: web_sys::DragEvent| e.prevent_default() on:drop=on_drop>
            <h1>"Your snapshot " <small>"a PyTorch memory snapshot, replayed on vramlab's allocator in this page (nothing is uploaded)"</small></h1>
            <p class="open">
                <label class="file">"Open a snapshot "
                    <input id="snapshot-file" type="file" accept=".pickle,.pkl,.json"
                        on:change=move |e| open_file(r, files::first(files::of_input(&e))) />
                </label>
                " or drop it here. Record one with "
                <code>"torch.cuda.memory._record_memory_history()"</code>" … "
                <code>"torch.cuda.memory._dump_snapshot(\"x.pickle\")"</code>
                "; or, in the playground, replay its session."
            </p>
            <p id="snapshot-progress" role="status">{move || r.progress.get()}</p>
            <p id="snapshot-error" class="outcome bad" role="alert">{move || r.error.get()}</p>
            {move || r.opened.get().map(|o| view! {
                <Headline opened=o.clone() r=r />
                <Summary opened=o.clone() r=r />
                <FixPanel opened=o.clone() r=r />
                <WhatIfForm opened=o.clone() r=r />
                <CompareChart r=r />
                <ActiveChart r=r />
                <DiffPanel r=r />
                <WindowForm opened=o.clone() r=r />
                <TraceSegments r=r />
                <TraceEvents r=r />
            })}
        </main>
    }
}

/// The out-of-memory in plain words first, where the trace has one:
/// where it ran out and what it asked for; once the fix is searched (as
/// the recording opens, or when asked, for a long one), whether a setting
/// helps or by how much the live tensors exceed the room, and the frames
/// holding the most.
#[component]
fn Headline(opened: std::sync::Arc<Opened>, r: Replays) -> impl IntoView {
    let first = first_oom_words(&opened.snapshot, opened.device)?;
    let c = r.compare;
    let words = move || match c
        .fix
        .get()
        .and_then(|f| f.report.as_ref().map(|r| r.headline()))
    {
        Some(headline) => headline,
        None if c.searching.get() => format!("{first} Searching the settings that would avoid it…"),
        None => format!("{first} The fix below searches the settings that would avoid it."),
    };
    Some(view! { <p id="snapshot-headline" class="headline" role="status">{words}</p> })
}

/// What the file is and whether the replay follows it exactly.
#[component]
fn Summary(opened: std::sync::Arc<Opened>, r: Replays) -> impl IntoView {
    let run = &opened.recorded;
    let verdict = match (&opened.inexact, run.exact, &run.first_difference) {
        (Some(why), _, _) => format!("Replayed under its recorded settings, not checked event by event: {why}."),
        (None, Some(true), _) => "Replayed exactly: every segment and every block where the recording put it.".to_string(),
        (None, _, Some(d)) => format!(
            "The replay first differs at event {}: the recording has {}; vramlab's allocator made {}.",
            d.event, d.trace, d.engine
        ),
        (None, _, None) => String::new(),
    };
    view! {
        <p id="snapshot-summary" class="summary" class:exact=run.exact == Some(true)>
            <b>{opened.name.clone()}</b>
            {format!(
                " · {} · {} events · {} segments at the dump",
                format_size(opened.bytes as u64),
                run.events,
                opened.snapshot.segments.len()
            )}
            <DevicePicker opened=opened.clone() r=r />
            " · read and replayed in "<span id="snapshot-ms">{format!("{:.0}", opened.ms)}</span>" ms"
            <br />
            <span id="snapshot-verdict">{verdict}</span>
        </p>
        <Comparison r=r />
    }
}

/// Which GPU's trace: every traced device, with its events and
/// out-of-memory errors (a recording of several GPUs opens on the one that
/// ran out).
#[component]
fn DevicePicker(opened: std::sync::Arc<Opened>, r: Replays) -> impl IntoView {
    let snapshot = &opened.snapshot;
    if snapshot.device_traces.len() < 2 {
        return None;
    }
    let options = (0..snapshot.device_traces.len())
        .map(|d| {
            let events = snapshot.trace(d).len();
            let label = match recorded_ooms(snapshot, d) {
                0 => format!("cuda:{d} · {events} events"),
                n => format!("cuda:{d} · {events} events · {n} out of memory"),
            };
            view! { <option value=d.to_string() selected=d == opened.device disabled=events == 0>{label}</option> }
        })
        .collect::<Vec<_>>();
    Some(view! {
        " · "
        <label>"device "
            <select id="snapshot-device"
                on:change=move |e| {
                    if let Ok(d) = event_target_value(&e).parse() {
                        r.open_device(d);
                    }
                }>
                {options}
            </select>
        </label>
    })
}

fn ooms(run: &ReplayRun) -> String {
    match (run.ooms.first(), run.recorded_ooms) {
        (Some(first), _) => format!("{} (first at event {})", run.ooms.len(), first.event),
        (None, 0) => "none".into(),
        (None, n) => format!("none here; {n} in the recording"),
    }
}

/// Peak, fragmentation and out-of-memory errors of both runs.
#[component]
fn Comparison(r: Replays) -> impl IntoView {
    let rows = move || {
        let opened = r.opened.get()?;
        let what_if = r.what_if.get();
        let cell = |f: &dyn Fn(&ReplayRun) -> String| {
            (f(&opened.recorded), what_if.as_ref().map(|w| f(&w.run)))
        };
        Some([
            (
                "peak reserved (max_memory_reserved)",
                cell(&|run| format_size(run.peak_reserved_bytes)),
            ),
            (
                "peak allocated (max_memory_allocated)",
                cell(&|run| format_size(run.peak_allocated_bytes)),
            ),
            (
                "fragmentation (reserved − allocated)",
                cell(&|run| {
                    format!(
                        "{} {}",
                        format_size(run.fragmentation.bytes),
                        run.fragmentation.moment()
                    )
                }),
            ),
            ("out of memory", cell(&ooms)),
        ])
    };
    let heading = move || {
        r.what_if
            .get()
            .map(|w| format!("what if {}", describe_what_if(&w.asked)))
    };
    view! {
        <table id="what-if-table" class="compare">
            <thead><tr><th></th><th>"as recorded"</th><th>{heading}</th></tr></thead>
            <tbody>
                {move || rows().into_iter().flatten().map(|(name, (recorded, what_if))| view! {
                    <tr><td>{name}</td><td class="num">{recorded}</td><td class="num">{what_if.unwrap_or_default()}</td></tr>
                }).collect::<Vec<_>>()}
            </tbody>
        </table>
    }
}

/// The settings a what-if changes, each starting at its recorded value
/// (a what-if changes only what the user changes), the recorded settings
/// said above them.
#[component]
fn WhatIfForm(opened: std::sync::Arc<Opened>, r: Replays) -> impl IntoView {
    let recorded = &opened.recorded.settings;
    let recorded_words = describe_recorded(&opened.snapshot);
    let room_words = match fix::room(&opened.snapshot, opened.device, &opened.recorded) {
        Some(room) if room.exact => format!(
            "Without a card or size, it replays in {}: what the process held at its out-of-memory and the driver still had free (the room the fix searches in).",
            format_size(room.bytes)
        ),
        Some(room) => format!(
            "Without a card or size, it replays in {}: the most the process held before its out-of-memory, a limit of its own (the room the fix searches in).",
            format_size(room.bytes)
        ),
        None => "Without a card or size, it replays on a device as large as it needs: name one to ask whether it fits.".to_string(),
    };
    let expandable = RwSignal::new(recorded.expandable_segments);
    let max_split = RwSignal::new(
        recorded
            .max_split_size_mb
            .map_or(String::new(), |m| m.to_string()),
    );
    let gc = RwSignal::new(format!("{}", recorded.garbage_collection_threshold));
    let gpu = RwSignal::new(None::<GpuModel>);
    let mib = RwSignal::new(String::new());
    // Only what differs from the recording.
    let (was_expandable, was_split, was_gc) = (
        recorded.expandable_segments,
        recorded.max_split_size_mb,
        recorded.garbage_collection_threshold,
    );
    let settings = move || {
        let split: Option<u64> = max_split.get_untracked().trim().parse().ok();
        let gc = vramlab_shared::input::decimal(gc.get_untracked().trim()).unwrap_or(0.0);
        RestartSettings {
            expandable_segments: Some(expandable.get_untracked()).filter(|&e| e != was_expandable),
            max_split_size_mb: Some(split).filter(|&s| s != was_split),
            garbage_collection_threshold: Some(gc).filter(|&g| g != was_gc),
            gpu: gpu.get_untracked(),
            device_total_bytes: mib
                .get_untracked()
                .trim()
                .parse::<u64>()
                .ok()
                .map(|m| m * MIB),
            ..Default::default()
        }
    };
    let command = move || {
        r.what_if.get().map(|w: std::sync::Arc<WhatIf>| {
            format!(
                "vramlab replay {} --what-if '{}'",
                opened.name,
                describe_what_if(&w.asked)
            )
        })
    };
    view! {
        <fieldset class="what-if">
            <legend>"What if"</legend>
            <p id="what-if-recorded">{recorded_words}</p>
            <p id="what-if-room" class="hint">{room_words}</p>
            <label>{checkbox(expandable)}" expandable_segments"</label>
            <label>"max_split_size_mb " {text_input("what-if-max-split", "5", "none", max_split)}</label>
            <label>"garbage_collection_threshold " {text_input("what-if-gc", "4", "0", gc)}</label>
            <label>"on a GPU "
                <select id="what-if-gpu" on:change=move |e| gpu.set(GpuModel::from_id(&event_target_value(&e)))>
                    <option value="">"of any size"</option>
                    {GpuModel::ALL.map(|g| view! { <option value=g.id()>{g.spec().name}</option> })}
                </select>
            </label>
            <label>"or of (MiB) " {text_input("what-if-mib", "6", "", mib)}</label>
            <button id="btn-what-if" on:click=move |_| r.run_what_if(settings())>"Replay what if"</button>
            <button id="btn-export-what-if" disabled=move || r.what_if.get().is_none()
                title="The what-if run as a snapshot that pytorch.org/memory_viz opens"
                on:click=move |_| r.save_what_if()>"save the what-if as a snapshot"</button>
            <p id="what-if-error" class="outcome bad" role="alert">{move || r.what_if_error.get()}</p>
            <p class="cli"><code id="what-if-command">{command}</code>
                {move || r.what_if.get().map(|w| format!(" · replayed in {:.0} ms", w.ms))}</p>
        </fieldset>
    }
}

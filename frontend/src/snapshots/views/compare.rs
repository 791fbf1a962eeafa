//! The snapshot page's questions after "what happened": a window of the
//! events, the fix searched for a recorded out-of-memory, and two runs
//! compared. Each says what its `vramlab` command prints (the same lines,
//! from the engine).

use super::chart::{polyline, H, W};
use crate::files;
use crate::playground::views::text_input;
use crate::snapshots::replays::{Compared, Opened, Replays};
use leptos::prelude::*;
use std::sync::Arc;
use vramlab_shared::torch_snapshot::diff::diff_lines;
use vramlab_shared::torch_snapshot::fix::fix_lines;
use vramlab_shared::torch_snapshot::replay::recorded_ooms;
use vramlab_shared::units::format_size;

/// Events i..j, or n either side of the peak, as a recording of their own.
#[component]
pub fn WindowForm(opened: Arc<Opened>, r: Replays) -> impl IntoView {
    let events = opened.trace().len();
    let from = RwSignal::new(String::new());
    let to = RwSignal::new(String::new());
    let either_side = RwSignal::new("1000".to_string());
    let number = |s: RwSignal<String>| s.get_untracked().trim().parse::<usize>().ok();
    let open_range = move |_| {
        let blank = |s: RwSignal<String>| s.get_untracked().trim().is_empty();
        let i = if blank(from) { Some(0) } else { number(from) };
        let j = if blank(to) { Some(events) } else { number(to) };
        match (i, j) {
            (Some(i), Some(j)) => r.open_window(i..j),
            _ => r.compare.error.set(Some(
                "events are whole numbers: from (0 when blank) to (the end when blank)".into(),
            )),
        }
    };
    let open_around = move |_| match number(either_side) {
        Some(n) => r.open_around_peak(n),
        None => r.compare.error.set(Some(
            "either side of the peak takes a whole number of events".into(),
        )),
    };
    view! {
        <fieldset class="what-if window">
            <legend>"Events"</legend>
            <label>"from " {text_input("window-from", "7", "0", from)}</label>
            <label>" to " {text_input("window-to", "7", "the end", to)}</label>
            <button id="btn-window" on:click=open_range>"Open these events"</button>
            " or "
            {text_input("window-around", "6", "1000", either_side)}
            <button id="btn-around-peak" on:click=open_around>"either side of the peak"</button>
            {move || r.compare.whole.get().map(|w| view! {
                " "
                <button id="btn-whole" on:click=move |_| r.open_whole()>{format!("the whole of {}", w.name)}</button>
            })}
            <p class="hint">"A window is a recording of its own: the state at its first event rebuilt, its events numbered from 0 (as "<code>"vramlab replay --events I..J"</code>" saves it)."</p>
        </fieldset>
    }
}

/// The fix, searched when asked: the settings that run the recording
/// through its out-of-memory, each one a what-if to replay here.
#[component]
pub fn FixPanel(opened: Arc<Opened>, r: Replays) -> impl IntoView {
    let ooms = recorded_ooms(&opened.snapshot, opened.device);
    let name = opened.name.clone();
    let c = r.compare;
    view! {
        <fieldset class="what-if fix">
            <legend>"The fix"</legend>
            <button id="btn-fix" disabled=move || ooms == 0 || c.searching.get()
                title=if ooms == 0 { "This trace has no out-of-memory" } else { "Replay the recorded requests under other settings and GPUs" }
                on:click=move |_| r.search_fix()>"Search the settings that avoid the out-of-memory"</button>
            {(ooms == 0).then_some(" (this trace has no out-of-memory: nothing to fix)")}
            {move || c.searching.get().then_some(" searching (each setting is a replay)…")}
            {move || c.fix.get().map(|f| {
                // Each setting that runs it, with the what-if that replays it.
                let ranked: Vec<_> = f.report.iter()
                    .flat_map(|rep| rep.ranked().into_iter().filter(|x| x.alloc_conf.is_some()).map(|x| (x.clone(), rep.what_if(x))))
                    .collect();
                let none = ranked.is_empty();
                view! {
                    <ul id="fix-lines" class="said">
                        {fix_lines(f.report.as_ref()).into_iter().map(|l| view! { <li>{l}</li> }).collect::<Vec<_>>()}
                    </ul>
                    <table id="fix-table" class="compare" hidden=none>
                        <thead><tr><th>"PYTORCH_CUDA_ALLOC_CONF"</th><th>"peak reserved"</th><th></th></tr></thead>
                        <tbody>
                            {ranked.into_iter().map(|(cand, settings)| {
                                view! { <tr>
                                    <td><code>{cand.alloc_conf.clone()}</code></td>
                                    <td class="num">{format_size(cand.peak_reserved_bytes)}</td>
                                    <td><button class="fix-replay" on:click=move |_| {
                                        if let Ok(s) = &settings { r.run_what_if(s.clone()) }
                                    }>"replay it"</button></td>
                                </tr> }
                            }).collect::<Vec<_>>()}
                        </tbody>
                    </table>
                    <p class="cli"><code>{format!("vramlab replay {name} --fix")}</code>{format!(" · searched in {:.0} ms", f.ms)}</p>
                }
            })}
        </fieldset>
    }
}

/// Reads a second file and compares the open one with it.
fn compare_file(r: Replays, file: Option<web_sys::File>) {
    if let Some(file) = file {
        r.read_then(file, r.compare.error, move |name, _, snapshot, _| {
            r.compare_with(name, snapshot)
        });
    }
}

/// Two runs side by side: the open one (A) and another file or the
/// what-if (B), at their peaks of allocated memory.
#[component]
pub fn DiffPanel(r: Replays) -> impl IntoView {
    view! {
        <fieldset class="what-if diff">
            <legend>"Compare"</legend>
            <label class="file">"with another snapshot "
                <input id="diff-file" type="file" accept=".pickle,.pkl,.json"
                    on:change=move |e| compare_file(r, files::first(files::of_input(&e))) />
            </label>
            " or "
            <button id="btn-diff-what-if" disabled=move || r.what_if.get().is_none()
                on:click=move |_| r.compare_with_what_if()>"with the what-if"</button>
            {move || r.compare.diff.get().map(|c| view! {
                <ul id="diff-lines" class="said">
                    {diff_lines(&c.diff, &c.a_name, &c.b_name).into_iter().map(|l| view! { <li>{l}</li> }).collect::<Vec<_>>()}
                </ul>
                <DiffChart c=c.clone() />
                <p class="cli"><code id="diff-command">{c.command.clone()}</code>{format!(" · compared in {:.0} ms", c.ms)}</p>
            })}
        </fieldset>
        <p id="compare-error" class="outcome bad" role="alert">{move || r.compare.error.get()}</p>
    }
}

/// Both runs' allocated memory on one axis (events from each one's
/// first), each peak marked.
#[component]
fn DiffChart(c: Arc<Compared>) -> impl IntoView {
    let (a, b) = (&c.diff.a, &c.diff.b);
    let events = a.events.max(b.events);
    let top = a.allocated_bytes.max(b.allocated_bytes).max(1) as f64;
    let x = |e: usize| e as f64 / (events.max(2) as f64 - 1.0) * W;
    let y = |bytes: u64| H - bytes as f64 / top * H;
    view! {
        <svg id="diff-chart" class="replay-chart" viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none"
            role="img" aria-label="allocated after every event, A and B">
            <polyline points=polyline(&a.timeline, events, top, |p| p.allocated_bytes) fill="none" stroke="#0072b2" stroke-width="2" />
            <polyline points=polyline(&b.timeline, events, top, |p| p.allocated_bytes) fill="none" stroke="#cc79a7" stroke-width="2" stroke-dasharray="5 3" />
            <circle cx=x(a.event) cy=y(a.allocated_bytes) r="4" fill="#0072b2" />
            <circle cx=x(b.event) cy=y(b.allocated_bytes) r="4" fill="#cc79a7" />
        </svg>
        <p class="keys">
            <span class="key-line" style="border-top: 3px solid #0072b2"></span>{format!("A {}", c.a_name)}" · "
            <span class="key-line" style="border-top: 3px dashed #cc79a7"></span>{format!("B {}", c.b_name)}
            {format!(" · allocated, top {} · ● each peak", format_size(top as u64))}
        </p>
    }
}

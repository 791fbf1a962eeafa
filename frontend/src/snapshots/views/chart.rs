//! The recorded run and the what-if on one axis: allocated and reserved
//! after every trace event, the GPU's size when the what-if has one, the
//! out-of-memory errors, and the event being looked at (click to move it).

use crate::snapshots::replays::Replays;
use leptos::prelude::*;
use vramlab_shared::torch_snapshot::replay::TimelinePoint;
use vramlab_shared::torch_snapshot::Action;
use vramlab_shared::units::{format_size, GIB};

pub(super) const W: f64 = 800.0;
pub(super) const H: f64 = 160.0;
/// A what-if's device size above this is "any size".
const ANY_SIZE: u64 = 1024 * 1024 * GIB;

pub(super) fn polyline(
    points: &[TimelinePoint],
    events: usize,
    top: f64,
    f: fn(&TimelinePoint) -> u64,
) -> String {
    let n = events.max(2) as f64 - 1.0;
    points
        .iter()
        .map(|p| {
            format!(
                "{:.1},{:.1}",
                p.event as f64 / n * W,
                H - f(p) as f64 / top * H
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Everything the chart draws, scaled.
#[derive(Clone, PartialEq)]
struct Drawn {
    recorded: (String, String),
    what_if: Option<(String, String)>,
    gpu_line: Option<f64>,
    /// The what-if's GPU, when it is above the chart.
    gpu_above: Option<u64>,
    recorded_ooms: Vec<f64>,
    what_if_ooms: Vec<f64>,
    top: u64,
    x_of: f64,
}

fn drawn(r: Replays) -> Option<Drawn> {
    let opened = r.opened.get()?;
    let what_if = r.what_if.get();
    let events = opened.recorded.events;
    let gpu = what_if
        .as_ref()
        .map(|w| w.run.settings.device_total_bytes)
        .filter(|&b| b < ANY_SIZE);
    let runs_top = opened
        .recorded
        .peak_reserved_bytes
        .max(what_if.as_ref().map_or(0, |w| w.run.peak_reserved_bytes))
        .max(1);
    // A GPU far above both runs would flatten them: it is named instead.
    let (gpu, gpu_above) = match gpu {
        Some(g) if g > runs_top.saturating_mul(5) / 4 => (None, Some(g)),
        g => (g, None),
    };
    let top = runs_top.max(gpu.unwrap_or(0));
    let t = top as f64;
    let lines = |chart: &[TimelinePoint]| {
        (
            polyline(chart, events, t, |p| p.allocated_bytes),
            polyline(chart, events, t, |p| p.reserved_bytes),
        )
    };
    let x_of = W / (events.max(2) as f64 - 1.0);
    Some(Drawn {
        recorded: lines(&opened.chart),
        what_if: what_if.as_ref().map(|w| lines(&w.chart)),
        gpu_line: gpu.map(|g| H - g as f64 / t * H),
        gpu_above,
        recorded_ooms: (0..opened.trace().len())
            .filter(|&i| opened.trace().action(i) == Action::Oom)
            .map(|i| i as f64 * x_of)
            .collect(),
        what_if_ooms: what_if
            .map(|w| w.run.ooms.iter().map(|o| o.event as f64 * x_of).collect())
            .unwrap_or_default(),
        top,
        x_of,
    })
}

fn heading(d: &Drawn) -> String {
    let gpu = d
        .gpu_above
        .map(|g| format!("; the GPU's {} is far above", format_size(g)))
        .unwrap_or_default();
    format!(
        "(top: {}{gpu}; click to look at an event)",
        format_size(d.top)
    )
}

#[component]
pub fn CompareChart(r: Replays) -> impl IntoView {
    let d = Memo::new(move |_| drawn(r));
    let on_click = move |e: web_sys::MouseEvent| {
        let Some(target) = e.current_target() else {
            return;
        };
        let svg: web_sys::Element = wasm_bindgen::JsCast::unchecked_into(target);
        let rect = svg.get_bounding_client_rect();
        let x = (e.client_x() as f64 - rect.left()) / rect.width().max(1.0) * W;
        if let Some(x_of) = d.with_untracked(|d| d.as_ref().map(|d| d.x_of)) {
            r.selected.set((x / x_of).round().max(0.0) as usize);
        }
    };
    let selected_x =
        move || d.with(|d| d.as_ref().map_or(0.0, |d| r.selected.get() as f64 * d.x_of));
    let part = move |f: fn(&Drawn) -> Option<String>| {
        move || d.with(|d| d.as_ref().and_then(f)).unwrap_or_default()
    };
    view! {
        <h2>"Timeline " <small>{move || d.with(|d| d.as_ref().map(heading))}</small></h2>
        <svg id="replay-chart" class="replay-chart" viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none"
            role="img" aria-label="allocated and reserved after every event, as recorded and what if" on:click=on_click>
            {move || d.with(|d| d.as_ref().and_then(|d| d.gpu_line).map(|y| view! {
                <line x1="0" x2=W y1=y y2=y stroke="#444" stroke-dasharray="6 3" />
            }))}
            <polyline points=part(|d| d.what_if.as_ref().map(|w| w.1.clone())) fill="none" stroke="#009e73" stroke-width="2" stroke-dasharray="5 3" />
            <polyline points=part(|d| d.what_if.as_ref().map(|w| w.0.clone())) fill="none" stroke="#cc79a7" stroke-width="2" stroke-dasharray="5 3" />
            <polyline id="recorded-reserved" points=part(|d| Some(d.recorded.1.clone())) fill="none" stroke="#e69f00" stroke-width="2" />
            <polyline points=part(|d| Some(d.recorded.0.clone())) fill="none" stroke="#0072b2" stroke-width="2" />
            {move || d.with(|d| d.as_ref().map(|d| d.recorded_ooms.iter().map(|&x| view! {
                <line x1=x x2=x y1="0" y2="12" stroke="#d55e00" stroke-width="3" />
            }).collect::<Vec<_>>()))}
            {move || d.with(|d| d.as_ref().map(|d| d.what_if_ooms.iter().map(|&x| view! {
                <circle class="what-if-oom" cx=x cy="8" r="4" fill="#d55e00" />
            }).collect::<Vec<_>>()))}
            <line x1=selected_x x2=selected_x y1="0" y2=H stroke="#1b1b1b" />
        </svg>
        <p class="keys">
            {key("#0072b2", false, "allocated")}" · "{key("#e69f00", false, "reserved")}" as recorded · "
            {key("#cc79a7", true, "allocated")}" · "{key("#009e73", true, "reserved")}" what if · "
            {key("#444", true, "the GPU")}" · "{key("#d55e00", false, "recorded OOM")}" · ● what-if OOM"
        </p>
    }
}

/// A legend entry: a line sample in the chart's colour (solid or dashed),
/// the words in the text's own colour (readable on any background).
pub(super) fn key(colour: &'static str, dashed: bool, words: &'static str) -> impl IntoView {
    let style = format!(
        "border-top: 3px {} {colour}",
        if dashed { "dashed" } else { "solid" }
    );
    view! { <span class="key-line" style=style></span>{words} }
}

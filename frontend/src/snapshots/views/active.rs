//! memory_viz's "Active Memory Timeline" for the open trace, drawn when
//! asked (`torch_snapshot::active`): the largest allocations as bands
//! stacked in the order they were made, each with its size, the event
//! that made it and its stack; the smaller ones summed in a strip below.
//! Dragging across it zooms to those events (`active_timeline_in`: the
//! largest allocations alive in them), as memory_viz's zoom does.

use super::chart::{H, W};
use crate::snapshots::replays::Replays;
use leptos::prelude::*;
use std::sync::Arc;
use vramlab_shared::torch_snapshot::active::{active_timeline_in, ActiveTimeline, Band};
use vramlab_shared::units::format_size;

/// Allocations drawn one by one.
const BANDS: usize = 400;
/// Okabe-Ito, as the playground's categories.
const COLOURS: [&str; 7] = [
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442",
];

fn x(t: usize, events: usize) -> f64 {
    t as f64 / events.max(1) as f64 * W
}

fn y(bytes: u64, top: u64) -> f64 {
    H - bytes as f64 / top.max(1) as f64 * H
}

/// A band's outline: its top edge left to right, its bottom edge back.
fn outline(b: &Band, events: usize, top: u64) -> String {
    let mut upper = Vec::new();
    let mut lower = Vec::new();
    for (i, &(t, below)) in b.below.iter().enumerate() {
        if i > 0 {
            let prev = b.below[i - 1].1;
            upper.push((x(t, events), y(prev + b.size, top)));
            lower.push((x(t, events), y(prev, top)));
        }
        upper.push((x(t, events), y(below + b.size, top)));
        lower.push((x(t, events), y(below, top)));
    }
    let last = b.below.last().map_or(0, |&(_, o)| o);
    upper.push((x(b.end, events), y(last + b.size, top)));
    lower.push((x(b.end, events), y(last, top)));
    (upper.into_iter().chain(lower.into_iter().rev()))
        .map(|(px, py)| format!("{px:.1},{py:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a band's tooltip says (its events the trace's, `from` on).
fn said(r: Replays, b: &Band, from: usize) -> String {
    let made = match b.made {
        Some(e) => {
            let frames = r.opened.with_untracked(|o| {
                o.as_ref().map(|o| {
                    o.trace()
                        .frames(e)
                        .iter()
                        .map(|f| f.label())
                        .collect::<Vec<_>>()
                        .join("\n")
                })
            });
            format!("made at event {e}\n{}", frames.unwrap_or_default())
        }
        None => "live when the recording starts".into(),
    };
    format!(
        "{} · events {}..{} · {made}",
        format_size(b.size),
        b.start + from,
        b.end + from
    )
}

/// The event under a pointer on the chart, of the `span` events in view
/// from `from`.
fn event_at(e: &web_sys::MouseEvent, from: usize, span: usize) -> Option<usize> {
    use wasm_bindgen::JsCast;
    let svg = e.current_target()?.dyn_into::<web_sys::Element>().ok()?;
    let rect = svg.get_bounding_client_rect();
    let f = ((e.client_x() as f64 - rect.left()) / rect.width().max(1.0)).clamp(0.0, 1.0);
    Some(from + ((f * span as f64) as usize).min(span.saturating_sub(1)))
}

#[component]
pub fn ActiveChart(r: Replays) -> impl IntoView {
    let drawn = RwSignal::new(None::<Arc<ActiveTimeline>>);
    let error = RwSignal::new(None::<String>);
    let asked = RwSignal::new(false);
    // The events in view (from, to), or the whole trace.
    let zoom = RwSignal::new(None::<(usize, usize)>);
    let drag = RwSignal::new(None::<usize>);
    Effect::new(move |_| {
        let (Some(opened), true) = (r.opened.get(), asked.get()) else {
            return;
        };
        let events = opened.snapshot.trace(opened.device).len();
        let range = zoom.get().map_or(0..events, |(a, b)| a..b);
        match active_timeline_in(&opened.snapshot, opened.device, BANDS, range) {
            Ok(a) => drawn.set(Some(Arc::new(a))),
            Err(e) => error.set(Some(e.to_string())),
        }
    });
    // Another trace opened: drawn again when asked, whole.
    Effect::new(move |_| {
        r.opened.track();
        asked.set(false);
        zoom.set(None);
        drawn.set(None);
        error.set(None);
    });
    let from = move || zoom.get().map_or(0, |(a, _)| a);
    let span = move || drawn.with(|d| d.as_ref().map_or(0, |a| a.events));
    let on_down = move |e: web_sys::MouseEvent| {
        drag.set(event_at(&e, from(), span()));
    };
    let on_up = move |e: web_sys::MouseEvent| {
        let (Some(a), Some(b)) = (drag.get_untracked(), event_at(&e, from(), span())) else {
            return;
        };
        drag.set(None);
        if a != b {
            zoom.set(Some((a.min(b), a.max(b) + 1)));
        }
    };
    view! {
        <h2>"Active memory timeline " <small>"as pytorch.org/memory_viz draws it: each allocation a band while it lives, stacked in the order they were made"</small></h2>
        <p>
            <button id="btn-active" on:click=move |_| asked.set(true) disabled=move || asked.get()>"Draw it"</button>
            <button id="active-reset" disabled=move || zoom.get().is_none() on:click=move |_| zoom.set(None)>"show all"</button>
            <span class="outcome bad" role="alert">{move || error.get()}</span>
        </p>
        {move || drawn.get().map(|a| {
            let (events, top, first) = (a.events, a.top, from());
            let bands_top = (a.bands.iter())
                .map(|b| b.size + b.below.iter().map(|&(_, o)| o).max().unwrap_or(0))
                .max()
                .unwrap_or(0)
                .max(1);
            let rest_top = a.rest.iter().map(|&(_, b)| b).max().unwrap_or(0).max(1);
            let polygons = a.bands.iter().enumerate().map(|(i, b)| view! {
                <polygon class="band" points=outline(b, events, bands_top) fill=COLOURS[i % COLOURS.len()]>
                    <title>{said(r, b, first)}</title>
                </polygon>
            }).collect::<Vec<_>>();
            let mut rest_points = vec![format!("0,{H}")];
            for w in a.rest.windows(2) {
                rest_points.push(format!("{:.1},{:.1}", x(w[1].0, events), y(w[0].1, rest_top)));
                rest_points.push(format!("{:.1},{:.1}", x(w[1].0, events), y(w[1].1, rest_top)));
            }
            rest_points.push(format!("{W},{H}"));
            view! {
                <svg id="active-chart" class="replay-chart" viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none"
                    role="img" aria-label="the largest allocations as bands over the events they lived; drag across events to zoom"
                    on:mousedown=on_down on:mouseup=on_up>
                    {polygons}
                </svg>
                <p class="keys" id="active-keys">{format!(
                    "Events {}..{}: {} allocations drawn, the largest alive in them (top: {}; at most {} allocated at once, the smaller ones included); hover a band for its size and stack, drag across events to zoom.",
                    first, first + events, a.bands.len(), format_size(bands_top), format_size(top)
                )}</p>
                {(a.summarized > 0).then(|| view! {
                    <svg id="active-rest" class="replay-chart rest" viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none"
                        role="img" aria-label="the smaller allocations, summed">
                        <polygon points=rest_points.join(" ") fill="#999" />
                    </svg>
                    <p class="keys">{format!(
                        "The other {} allocations, summed (top: {}).",
                        a.summarized, format_size(rest_top)
                    )}</p>
                })}
            }
        })}
    }
}

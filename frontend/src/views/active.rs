//! memory_viz's "Active Memory Timeline" for the open trace, drawn when
//! asked (`torch_snapshot::active`): the largest allocations as bands
//! stacked in the order they were made, each with its size, the event
//! that made it and its stack; the smaller ones summed in a strip below.

use super::replay_chart::{H, W};
use crate::replay::Replays;
use leptos::prelude::*;
use std::sync::Arc;
use vramlab_shared::torch_snapshot::active::{active_timeline, ActiveTimeline, Band};
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

/// What a band's tooltip says.
fn said(r: Replays, b: &Band) -> String {
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
        b.start,
        b.end
    )
}

#[component]
pub fn ActiveChart(r: Replays) -> impl IntoView {
    let drawn = RwSignal::new(None::<Arc<ActiveTimeline>>);
    let error = RwSignal::new(None::<String>);
    let draw = move |_| {
        let Some(opened) = r.opened.get_untracked() else {
            return;
        };
        match active_timeline(&opened.snapshot, opened.device, BANDS) {
            Ok(a) => drawn.set(Some(Arc::new(a))),
            Err(e) => error.set(Some(e.0)),
        }
    };
    // Another trace opened: drawn again when asked.
    Effect::new(move |_| {
        r.opened.track();
        drawn.set(None);
        error.set(None);
    });
    view! {
        <h2>"Active memory timeline " <small>"as pytorch.org/memory_viz draws it: each allocation a band while it lives, stacked in the order they were made"</small></h2>
        <p>
            <button id="btn-active" on:click=draw disabled=move || drawn.get().is_some()>"Draw it"</button>
            <span class="outcome bad" role="alert">{move || error.get()}</span>
        </p>
        {move || drawn.get().map(|a| {
            let (events, top) = (a.events, a.top);
            let bands_top = (a.bands.iter())
                .map(|b| b.size + b.below.iter().map(|&(_, o)| o).max().unwrap_or(0))
                .max()
                .unwrap_or(0)
                .max(1);
            let rest_top = a.rest.iter().map(|&(_, b)| b).max().unwrap_or(0).max(1);
            let polygons = a.bands.iter().enumerate().map(|(i, b)| view! {
                <polygon class="band" points=outline(b, events, bands_top) fill=COLOURS[i % COLOURS.len()]>
                    <title>{said(r, b)}</title>
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
                    role="img" aria-label="the largest allocations as bands over the events they lived">
                    {polygons}
                </svg>
                <p class="keys">{format!(
                    "{} allocations drawn, the largest (top: {}; at most {} allocated at once, the smaller ones included); hover a band for its size and stack.",
                    a.bands.len(), format_size(bands_top), format_size(top)
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

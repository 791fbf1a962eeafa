//! An opened trace, event by event: the segment map after the event being
//! looked at (as recorded, or what if), the events around it, and its
//! stack frames.

use crate::clock::now_ms;
use crate::playground::views::segments::{draw, heading, hover};
use crate::snapshots::replays::{Replays, Shown};
use leptos::html;
use leptos::prelude::*;
use vramlab_shared::torch_snapshot::format::user_frame;
use vramlab_shared::torch_snapshot::TraceEntry;
use vramlab_shared::units::format_size;

/// Events listed around the selected one.
const AROUND: usize = 12;

#[component]
pub fn TraceSegments(r: Replays) -> impl IntoView {
    let canvas = NodeRef::<html::Canvas>::new();
    let segments = Memo::new(move |_| r.segments());
    let draw_ms = RwSignal::new(0.0);
    let tip = RwSignal::new(String::new());
    Effect::new(move |_| {
        let Some(c) = canvas.get() else { return };
        let start = now_ms();
        let width = c.client_width().max(0) as u32;
        segments.with(|s| match s {
            Some(Ok(s)) => draw(&c, width, s, &|_| false),
            _ => draw(&c, width, &[], &|_| false),
        });
        draw_ms.set(now_ms() - start);
    });
    let on_move = move |e: web_sys::MouseEvent| {
        let Some(c) = canvas.get() else { return };
        let text = segments.with(|s| match s {
            Some(Ok(s)) => hover(&c, &e, s),
            _ => None,
        });
        tip.set(text.unwrap_or_default());
    };
    let title = move || {
        segments.with(|s| match s {
            Some(Ok(s)) => heading(s, draw_ms.get()),
            Some(Err(why)) => format!(" {why}"),
            None => String::new(),
        })
    };
    let on_shown = move |e| {
        r.shown.set(if event_target_value(&e) == "what-if" {
            Shown::WhatIf
        } else {
            Shown::Recorded
        })
    };
    view! {
        <h2>{move || format!("Segments after event {} ", r.selected.get())}
            <select id="segments-of" aria-label="Whose segments" on:change=on_shown
                prop:value=move || if r.shown.get() == Shown::WhatIf { "what-if" } else { "recorded" }>
                <option value="recorded">"as recorded"</option>
                <option value="what-if" disabled=move || r.what_if.get().is_none()>"what if"</option>
            </select>
            <small id="replay-segments-heading">{title}</small>
        </h2>
        <div class="tip" id="replay-segment-tip">{move || tip.get()}</div>
        <div class="map-scroll">
            <canvas id="replay-segment-map" node_ref=canvas on:mousemove=on_move></canvas>
        </div>
    }
}

fn where_from(e: &TraceEntry) -> String {
    user_frame(&e.frames).map(|f| f.label()).unwrap_or_default()
}

#[component]
pub fn TraceEvents(r: Replays) -> impl IntoView {
    let rows = move || {
        let opened = r.opened.get()?;
        let trace = opened.trace();
        let at = r.selected.get().min(trace.len().saturating_sub(1));
        let from = at.saturating_sub(AROUND);
        let to = (at + AROUND + 1).min(trace.len());
        Some(
            (from..to)
                .zip(trace.rows(from..to))
                .map(|(i, e)| {
                    let (action, addr, size, stream) = (e.action.name().to_string(), e.addr, e.size, e.stream);
                    view! {
                        <tr class:selected=i == at on:click=move |_| r.selected.set(i)>
                            <td class="num">{i}</td><td>{action}</td>
                            <td class="num">{format!("{addr:#x}")}</td><td class="num">{format_size(size)}</td>
                            <td class="num">{stream}</td><td>{where_from(&e)}</td>
                        </tr>
                    }
                })
                .collect::<Vec<_>>(),
        )
    };
    let frames = move || {
        let opened = r.opened.get()?;
        let e = opened.trace().get(r.selected.get())?;
        Some(
            e.frames
                .iter()
                .map(|f| view! { <li>{f.label()}</li> })
                .collect::<Vec<_>>(),
        )
    };
    let step = move |by: isize| {
        move |_| {
            let last = r
                .opened
                .with(|o| o.as_ref().map_or(0, |o| o.trace().len().saturating_sub(1)));
            r.selected
                .update(|s| *s = s.saturating_add_signed(by).min(last));
        }
    };
    view! {
        <div class="two">
            <div class="trace">
                <h2>"Events " <button on:click=step(-1) aria-label="previous event">"◀"</button>
                    <button id="next-event" on:click=step(1) aria-label="next event">"▶"</button></h2>
                <table id="trace-events">
                    <thead><tr><th>"#"</th><th>"action"</th><th>"addr"</th><th>"size"</th><th>"stream"</th><th>"from"</th></tr></thead>
                    <tbody>{rows}</tbody>
                </table>
            </div>
            <div class="frames">
                <h2>"Stack of the event"</h2>
                <ol id="trace-frames">{frames}</ol>
            </div>
        </div>
    }
}

//! The segment map: one row per segment, its blocks drawn to scale on a
//! canvas, and what the pointer is over.

use super::{colour, CACHED};
use crate::clock::now_ms;
use crate::state::App;
use leptos::html;
use leptos::prelude::*;
use vramlab_shared::alloc::BlockState;
use vramlab_shared::snapshot::{BlockSnapshot, SegmentSnapshot};
use vramlab_shared::units::format_size;
use wasm_bindgen::JsCast;

const ROW: f64 = 16.0;
const LABEL: f64 = 70.0;
/// A canvas can be about 32,000 pixels tall.
const MAX_ROWS: usize = 2000;

/// Draws every segment (up to [`MAX_ROWS`]) on the canvas.
pub(super) fn draw(c: &web_sys::HtmlCanvasElement, segments: &[SegmentSnapshot]) -> Option<()> {
    let width = c.client_width().max(300) as f64;
    let rows = segments.len().clamp(1, MAX_ROWS);
    c.set_width(width as u32);
    c.set_height((rows as f64 * ROW) as u32);
    let ctx = c
        .get_context("2d")
        .ok()??
        .dyn_into::<web_sys::CanvasRenderingContext2d>()
        .ok()?;
    ctx.clear_rect(0.0, 0.0, width, rows as f64 * ROW);
    ctx.set_font("10px sans-serif");
    let span = width - LABEL;
    for (r, seg) in segments.iter().take(MAX_ROWS).enumerate() {
        let y = r as f64 * ROW;
        ctx.set_fill_style_str("#333");
        let _ = ctx.fill_text(&format_size(seg.total_size), 2.0, y + 11.0);
        for b in &seg.blocks {
            let x = LABEL + (b.address - seg.address) as f64 / seg.total_size as f64 * span;
            let w = (b.size as f64 / seg.total_size as f64 * span).max(1.0);
            let fill = match (b.state, b.category) {
                (BlockState::ActiveAllocated, Some(c)) => colour(c),
                (BlockState::ActiveAllocated, None) => "#666",
                (BlockState::Inactive, _) => CACHED,
            };
            ctx.set_fill_style_str(fill);
            ctx.fill_rect(x, y + 1.0, w, ROW - 2.0);
        }
    }
    Some(())
}

/// What the pointer is over: the block's address, size, owner.
pub(super) fn hover(
    c: &web_sys::HtmlCanvasElement,
    e: &web_sys::MouseEvent,
    segments: &[SegmentSnapshot],
) -> Option<String> {
    let rect = c.get_bounding_client_rect();
    let (x, y) = (
        e.client_x() as f64 - rect.left(),
        e.client_y() as f64 - rect.top(),
    );
    let seg = segments.get((y / ROW) as usize)?;
    block_at(seg, x, rect.width() - LABEL).map(describe)
}

/// The block under a point of a row `span` pixels wide, if any.
fn block_at(seg: &SegmentSnapshot, x: f64, span: f64) -> Option<&BlockSnapshot> {
    let at = seg.address + (((x - LABEL) / span).clamp(0.0, 1.0) * seg.total_size as f64) as u64;
    seg.blocks
        .iter()
        .find(|b| at >= b.address && at < b.address + b.size)
}

fn describe(b: &BlockSnapshot) -> String {
    format!(
        "{:#x} · {} (asked {}) · {}{}",
        b.address,
        format_size(b.size),
        format_size(b.requested_size),
        match (&b.owner, b.state) {
            (Some(owner), _) => owner.clone(),
            (None, BlockState::ActiveAllocated) => "allocated".into(),
            (None, BlockState::Inactive) => "free (cached)".into(),
        },
        b.category
            .map(|c| format!(" · {}", c.name()))
            .unwrap_or_default()
    )
}

pub(super) fn heading(segments: &[SegmentSnapshot], draw_ms: f64) -> String {
    let blocks: usize = segments.iter().map(|g| g.blocks.len()).sum();
    let shown = if segments.len() > MAX_ROWS {
        format!(" (the first {MAX_ROWS} drawn)")
    } else {
        String::new()
    };
    format!(
        " {} segments{shown}, {blocks} blocks, drawn in {draw_ms:.1} ms",
        segments.len()
    )
}

#[component]
pub fn SegmentMap(app: App) -> impl IntoView {
    let canvas = NodeRef::<html::Canvas>::new();
    let tip = RwSignal::new(String::new());
    Effect::new(move |_| {
        let Some(c) = canvas.get() else {
            return;
        };
        let start = now_ms();
        app.snapshot
            .with(|snap| snap.as_ref().and_then(|s| draw(&c, &s.segments)));
        app.draw_ms.set(now_ms() - start);
    });
    let on_move = move |e: web_sys::MouseEvent| {
        let Some(c) = canvas.get() else {
            return;
        };
        let text = app
            .snapshot
            .with(|snap| hover(&c, &e, &snap.as_ref()?.segments));
        tip.set(text.unwrap_or_default());
    };
    let title = move || {
        app.snapshot
            .with(|s| s.as_ref().map(|s| heading(&s.segments, app.draw_ms.get())))
            .unwrap_or_default()
    };
    view! {
        <section class="segments" aria-label="Segment map">
            <h2>"Segments" <small>{title}</small></h2>
            <div class="tip" id="segment-tip">{move || tip.get()}</div>
            <div class="map-scroll">
                <canvas id="segment-map" node_ref=canvas on:mousemove=on_move></canvas>
            </div>
        </section>
    }
}

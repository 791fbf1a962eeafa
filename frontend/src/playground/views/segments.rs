//! The segment map: one row per segment, each row as long as its segment
//! (to scale with the largest), its blocks to scale inside it, with the
//! same colours as the bar; free blocks inside a segment that still holds
//! a tensor (inactive splits, which `empty_cache()` cannot return) are
//! underlined. What the pointer is over, and a list of the segments in
//! words for screen readers.

use super::{colour, CACHED};
use crate::clock::now_ms;
use crate::playground::state::App;
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
/// `width` is the canvas's width on screen, in CSS pixels.
/// Blocks for which `marked` holds are outlined.
pub(crate) fn draw(
    c: &web_sys::HtmlCanvasElement,
    width: u32,
    segments: &[SegmentSnapshot],
    marked: &dyn Fn(&BlockSnapshot) -> bool,
) -> Option<()> {
    let rows = segments.len().clamp(1, MAX_ROWS);
    let height = (rows as f64 * ROW) as u32;
    let width = width.max(300);
    // Setting a size, even the same one, would make the page lay out again.
    if c.width() != width {
        c.set_width(width);
    }
    if c.height() != height {
        c.set_height(height);
    }
    let width = f64::from(width);
    let ctx = c
        .get_context("2d")
        .ok()??
        .dyn_into::<web_sys::CanvasRenderingContext2d>()
        .ok()?;
    ctx.clear_rect(0.0, 0.0, width, rows as f64 * ROW);
    ctx.set_font("10px sans-serif");
    let largest = largest(segments);
    for (r, seg) in segments.iter().take(MAX_ROWS).enumerate() {
        let y = r as f64 * ROW;
        ctx.set_fill_style_str("#333");
        let _ = ctx.fill_text(&format_size(seg.total_size), 2.0, y + 11.0);
        let span = row_span(seg, largest, width);
        let in_use = seg
            .blocks
            .iter()
            .any(|b| b.state == BlockState::ActiveAllocated);
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
            if in_use && b.state == BlockState::Inactive {
                ctx.set_fill_style_str(SPLIT);
                ctx.fill_rect(x, y + ROW - 4.0, w, 2.0);
            }
            if marked(b) {
                ctx.set_stroke_style_str(MARK);
                ctx.set_line_width(2.0);
                ctx.stroke_rect(x + 1.0, y + 2.0, (w - 2.0).max(1.0), ROW - 4.0);
            }
        }
    }
    Some(())
}

/// Inactive splits' underline.
const SPLIT: &str = "#b33c00";
/// The outline of a block the last step changed.
const MARK: &str = "#000000";
/// The shortest row drawn, in pixels, so a small segment can be seen.
const MIN_ROW: f64 = 6.0;

fn largest(segments: &[SegmentSnapshot]) -> u64 {
    segments
        .iter()
        .map(|s| s.total_size)
        .max()
        .unwrap_or(1)
        .max(1)
}

/// A segment's row length: to scale with the largest segment.
fn row_span(seg: &SegmentSnapshot, largest: u64, width: f64) -> f64 {
    ((width - LABEL) * seg.total_size as f64 / largest as f64).max(MIN_ROW)
}

/// What the pointer is over: the block's address, size, owner.
pub(crate) fn hover(
    c: &web_sys::HtmlCanvasElement,
    e: &web_sys::MouseEvent,
    segments: &[SegmentSnapshot],
) -> Option<String> {
    block_under(c, e, segments).map(describe)
}

/// The block under the pointer.
pub(crate) fn block_under<'a>(
    c: &web_sys::HtmlCanvasElement,
    e: &web_sys::MouseEvent,
    segments: &'a [SegmentSnapshot],
) -> Option<&'a BlockSnapshot> {
    let rect = c.get_bounding_client_rect();
    let (x, y) = (
        e.client_x() as f64 - rect.left(),
        e.client_y() as f64 - rect.top(),
    );
    let seg = segments.get((y / ROW) as usize)?;
    let span = row_span(seg, largest(segments), rect.width());
    if x > LABEL + span {
        return None;
    }
    block_at(seg, x, span)
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

/// Segments listed in words (the canvas's text alternative).
const LISTED: usize = 100;

/// A segment in words: its size, its tensors, its free bytes.
pub(crate) fn in_words(seg: &SegmentSnapshot) -> String {
    let live: Vec<String> = seg
        .blocks
        .iter()
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| {
            format!(
                "{} {}",
                b.owner.as_deref().unwrap_or("a tensor"),
                format_size(b.size)
            )
        })
        .collect();
    let free: u64 = seg
        .blocks
        .iter()
        .filter(|b| b.state == BlockState::Inactive)
        .map(|b| b.size)
        .sum();
    let holds = if live.is_empty() {
        "no tensor".to_string()
    } else {
        live.join(", ")
    };
    let split = if live.is_empty() || free == 0 {
        ""
    } else {
        " (inactive splits: empty_cache() cannot return them)"
    };
    format!(
        "segment of {} at {:#x}: {holds}; {} free{split}",
        format_size(seg.total_size),
        seg.address,
        format_size(free)
    )
}

pub(crate) fn heading(segments: &[SegmentSnapshot], draw_ms: f64) -> String {
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
    // Drawn in the next frame, once however many deltas came before it.
    // The width on screen is measured only when it may have changed (it
    // makes the browser lay the page out at once).
    let queued = StoredValue::new(false);
    // (the window's width and projector mode then, the canvas's width).
    let width = StoredValue::new((0.0, false, 0));
    Effect::new(move |_| {
        app.memory.snapshot.track();
        app.display.projector.track();
        let Some(c) = canvas.get() else {
            return;
        };
        if queued.get_value() {
            return;
        }
        queued.set_value(true);
        request_animation_frame(move || {
            queued.set_value(false);
            let start = now_ms();
            let window = web_sys::window()
                .and_then(|w| w.inner_width().ok()?.as_f64())
                .unwrap_or(0.0);
            let projector = app.display.projector.get_untracked();
            let (was, was_projector, mut w) = width.get_value();
            if (was, was_projector) != (window, projector) {
                w = c.client_width().max(0) as u32;
                width.set_value((window, projector, w));
            }
            app.memory.snapshot.with_untracked(|snap| {
                snap.as_ref()
                    .and_then(|s| draw(&c, w, &s.segments, &|_| false))
            });
            app.display.draw_ms.set(now_ms() - start);
        });
    });
    let on_move = move |e: web_sys::MouseEvent| {
        let Some(c) = canvas.get() else {
            return;
        };
        let text = app
            .memory
            .snapshot
            .with(|snap| hover(&c, &e, &snap.as_ref()?.segments));
        tip.set(text.unwrap_or_default());
    };
    // Says what the canvas shows: it changes when a drawing is done.
    let title = move || {
        let ms = app.display.draw_ms.get();
        app.memory
            .snapshot
            .with_untracked(|s| s.as_ref().map(|s| heading(&s.segments, ms)))
            .unwrap_or_default()
    };
    view! {
        <section class="segments" aria-label="Segment map">
            <h2>"Segments" <small>{title}</small></h2>
            <div class="tip" id="segment-tip">{move || tip.get()}</div>
            <div class="map-scroll">
                <canvas id="segment-map" node_ref=canvas on:mousemove=on_move aria-describedby="segment-list"></canvas>
            </div>
            <p class="keys">"Rows to scale with the largest segment; colours as in the bar. "<span class="split-key"></span>" free inside a segment that still holds a tensor: an inactive split, which empty_cache() cannot return."</p>
            <ul class="sr-only" id="segment-list">
                {move || app.memory.snapshot.with(|s| s.as_ref().map(|s| s.segments.iter().take(LISTED).map(|g| view! { <li>{in_words(g)}</li> }).collect::<Vec<_>>()))}
            </ul>
        </section>
    }
}

//! Allocated, reserved and nvidia-smi over the commands, as steps: each
//! command has a slot, allocated rises to the peak during the command and
//! settles where it left it (a training run's sawtooth). The y axis zooms
//! to what changed; hover names the command and its numbers; drag to zoom
//! into commands, reset to see them all; the keys show or hide a line.

use super::colour_of;
use crate::clock::after_paint;
use crate::playground::history::Point;
use crate::playground::state::App;
use leptos::prelude::*;
use vramlab_shared::units::format_size;

const W: f64 = 640.0;
const H: f64 = 170.0;
/// Room for the y axis's labels, and for the command labels below.
const LEFT: f64 = 58.0;
const BELOW: f64 = 26.0;

/// The three lines: their names and colours (as on the numbers).
const LINES: [(&str, &str); 3] = [
    ("allocated", colour_of::ALLOCATED),
    ("reserved", colour_of::RESERVED),
    ("nvidia-smi", colour_of::DEVICE),
];

/// What is drawn: the points in view, the y range, the lines shown.
struct Frame<'a> {
    points: &'a [Point],
    first: usize,
    low: f64,
    high: f64,
}

impl Frame<'_> {
    fn slot(&self) -> f64 {
        (W - LEFT) / self.points.len().max(1) as f64
    }
    fn x(&self, i: usize) -> f64 {
        LEFT + i as f64 * self.slot()
    }
    fn y(&self, bytes: u64) -> f64 {
        let span = (self.high - self.low).max(1.0);
        H - (bytes as f64 - self.low) / span * (H - 8.0)
    }

    /// A step line through `f` of each point.
    fn steps(&self, f: impl Fn(&Point) -> u64) -> String {
        let mut out = String::new();
        for (i, p) in self.points.iter().enumerate() {
            let y = self.y(f(p));
            out.push_str(&format!(
                "{:.1},{y:.1} {:.1},{y:.1} ",
                self.x(i),
                self.x(i + 1)
            ));
        }
        out
    }

    /// Allocated with the peak inside each command's slot.
    fn allocated(&self) -> String {
        let mut out = String::new();
        for (i, p) in self.points.iter().enumerate() {
            let (x0, x1) = (self.x(i), self.x(i + 1));
            let settled = self.y(p.allocated);
            if p.peak > p.allocated {
                let top = self.y(p.peak);
                let mid = x0 + (x1 - x0) * 0.45;
                out.push_str(&format!(
                    "{x0:.1},{top:.1} {mid:.1},{top:.1} {mid:.1},{settled:.1} "
                ));
            } else {
                out.push_str(&format!("{x0:.1},{settled:.1} "));
            }
            out.push_str(&format!("{x1:.1},{settled:.1} "));
        }
        out
    }
}

/// The y range of the lines shown: from zero, or zoomed to what they span.
fn range(points: &[Point], shown: [bool; 3], zoom: bool) -> (f64, f64) {
    let values = points.iter().flat_map(|p| {
        [
            (shown[0], p.peak.max(p.allocated)),
            (shown[0], p.allocated),
            (shown[1], p.reserved),
            (shown[2], p.device),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, v)| v as f64)
    });
    let (mut low, mut high) = (f64::MAX, 0.0f64);
    for v in values {
        low = low.min(v);
        high = high.max(v);
    }
    if high == 0.0 {
        return (0.0, 1.0);
    }
    if !zoom || low == high {
        low = 0.0;
    }
    let pad = (high - low) * 0.06;
    ((low - pad).max(0.0), high + pad)
}

/// The command labels, on two rows, none over another.
fn labels(frame: &Frame) -> Vec<(f64, f64, String)> {
    let mut ends = [f64::NEG_INFINITY; 2];
    let mut out = Vec::new();
    for (i, p) in frame.points.iter().enumerate() {
        let Some((_, name)) = &p.label else { continue };
        let x = frame.x(i);
        let width = 5.2 * name.len() as f64;
        if let Some(row) = (0..2).find(|&r| x >= ends[r] + 3.0) {
            ends[row] = x + width;
            out.push((x, H + 11.0 + row as f64 * 11.0, name.clone()));
        }
    }
    out
}

/// One path for the labelled commands' vertical lines (one attribute to
/// change, however many commands there are).
fn mark_lines(labels: &[(f64, f64, String)]) -> String {
    labels
        .iter()
        .map(|(x, _, _)| format!("M{x:.1} 0V{H}"))
        .collect()
}

/// The words for the point under the pointer.
fn describe(p: &Point) -> String {
    let what = p
        .label
        .as_ref()
        .map_or("live sample".to_string(), |(step, name)| {
            format!("#{step} {name}")
        });
    let peak = if p.peak > p.allocated {
        format!(" · peak during it {}", format_size(p.peak))
    } else {
        String::new()
    };
    format!(
        "{what} · allocated {} · reserved {} · nvidia-smi {}{peak}",
        format_size(p.allocated),
        format_size(p.reserved),
        format_size(p.device)
    )
}

/// The three lines, the y axis's ticks, the command labels, the hovered
/// slot (its x, width and words), the first point's index, how many.
type Drawn = (
    [String; 3],
    Vec<(f64, String)>,
    Vec<(f64, f64, String)>,
    Option<(f64, f64, String)>,
    usize,
    usize,
);

fn drawing(
    points: &[Point],
    first: usize,
    shown: [bool; 3],
    zoom: bool,
    hover: Option<usize>,
) -> Drawn {
    let (low, high) = range(points, shown, zoom);
    let frame = Frame {
        points,
        first,
        low,
        high,
    };
    let ticks: Vec<(f64, String)> = (0..4)
        .map(|k| {
            let v = low + (high - low) * k as f64 / 3.0;
            (frame.y(v as u64), format_size(v as u64))
        })
        .collect();
    let lines = [
        frame.allocated(),
        frame.steps(|p| p.reserved),
        frame.steps(|p| p.device),
    ];
    let hovered = hover
        .filter(|&i| i < points.len())
        .map(|i| (frame.x(i), frame.slot(), describe(&points[i])));
    (
        lines,
        ticks,
        labels(&frame),
        hovered,
        frame.first,
        points.len(),
    )
}

/// The slot under a pointer event, in the points in view.
fn slot_at(e: &web_sys::MouseEvent, n: usize) -> Option<usize> {
    use wasm_bindgen::JsCast;
    let svg = e.current_target()?.dyn_into::<web_sys::Element>().ok()?;
    let rect = svg.get_bounding_client_rect();
    let x = (e.client_x() as f64 - rect.left()) / rect.width().max(1.0) * W;
    let i = ((x - LEFT) / ((W - LEFT) / n.max(1) as f64)).floor();
    (i >= 0.0).then_some((i as usize).min(n.saturating_sub(1)))
}

#[component]
pub fn Timeline(app: App) -> impl IntoView {
    // nvidia-smi starts hidden: its CUDA context would flatten the others.
    let shown = RwSignal::new([true, true, false]);
    let zoom = RwSignal::new(true);
    // The commands in view (indices into the history), or all of them.
    let window = RwSignal::new(None::<(usize, usize)>);
    let hover = RwSignal::new(None::<usize>);
    let drag = RwSignal::new(None::<usize>);
    // The chart follows the history after the numbers are on screen, once
    // however many points came in between.
    let redraw = Trigger::new();
    let queued = StoredValue::new(false);
    Effect::new(move |_| {
        app.memory.history.track();
        if !queued.get_value() {
            queued.set_value(true);
            after_paint(move || {
                queued.set_value(false);
                redraw.notify();
            });
        }
    });
    let in_view = move || {
        redraw.track();
        app.memory.history.with_untracked(|h| {
            let (a, b) = window
                .get()
                .map_or((0, h.len()), |(a, b)| (a.min(h.len()), b.min(h.len())));
            (a, h[a..b].to_vec())
        })
    };
    // Drawn once per change, however many parts of the chart read it.
    let drawn = Memo::new(move |_| {
        let (first, points) = in_view();
        drawing(&points, first, shown.get(), zoom.get(), hover.get())
    });
    let on_move =
        move |e: web_sys::MouseEvent| hover.set(slot_at(&e, drawn.with_untracked(|d| d.5)));
    let on_down =
        move |e: web_sys::MouseEvent| drag.set(slot_at(&e, drawn.with_untracked(|d| d.5)));
    let on_up = move |e: web_sys::MouseEvent| {
        let (Some(a), Some(b)) = (
            drag.get_untracked(),
            slot_at(&e, drawn.with_untracked(|d| d.5)),
        ) else {
            return;
        };
        drag.set(None);
        let first = drawn.with_untracked(|d| d.4);
        if a != b {
            window.set(Some((first + a.min(b), first + a.max(b) + 1)));
        }
    };
    // A restart empties the history: show all of the new one.
    Effect::new(move |_| {
        if app.memory.history.with(Vec::len) <= 1 {
            window.set(None);
        }
    });
    view! {
        <section class="timeline" aria-label="Timeline">
            <h2>"Timeline "<small>{move || format!("{} commands", app.memory.history.with(Vec::len))}</small></h2>
            <div class="timeline-keys" role="group" aria-label="Lines shown">
                {LINES.iter().enumerate().map(|(i, (name, colour))| view! {
                    <button class="key" id=format!("timeline-key-{i}") aria-pressed=move || shown.get()[i].to_string()
                        on:click=move |_| shown.update(|s| s[i] = !s[i])>
                        <i style=format!("background:{colour}")></i>{*name}</button>
                }).collect::<Vec<_>>()}
                <label><input type="checkbox" id="timeline-zoom" prop:checked=zoom on:change=move |e| zoom.set(event_target_checked(&e)) />" zoom to the changes"</label>
                <button id="timeline-reset" disabled=move || window.get().is_none() on:click=move |_| window.set(None)>"show all"</button>
            </div>
            <svg id="timeline" viewBox=format!("0 0 {W} {}", H + BELOW) role="img"
                aria-label="allocated, reserved and nvidia-smi after each command; drag across commands to zoom"
                on:mousemove=on_move on:mouseleave=move |_| hover.set(None) on:mousedown=on_down on:mouseup=on_up>
                {move || drawn.get().1.into_iter().map(|(y, label)| view! {
                    <g class="tick"><line x1=LEFT x2=W y1=y y2=y /><text x=LEFT - 4.0 y=y + 3.0 text-anchor="end">{label}</text></g>
                }).collect::<Vec<_>>()}
                <g class="mark">
                    <path d=move || drawn.with(|d| mark_lines(&d.2)) />
                    {move || drawn.get().2.into_iter().map(|(x, y, l)| view! { <text x=x + 1.0 y=y>{l}</text> }).collect::<Vec<_>>()}
                </g>
                <polyline class="line-device" points=move || drawn.with(|d| d.0[2].clone()) stroke=LINES[2].1 visibility=move || if shown.get()[2] { "visible" } else { "hidden" } />
                <polyline class="line-reserved" points=move || drawn.with(|d| d.0[1].clone()) stroke=LINES[1].1 visibility=move || if shown.get()[1] { "visible" } else { "hidden" } />
                <polyline class="line-allocated" points=move || drawn.with(|d| d.0[0].clone()) stroke=LINES[0].1 visibility=move || if shown.get()[0] { "visible" } else { "hidden" } />
                {move || drawn.get().3.map(|(x, w, _)| view! { <rect class="hover" x=x y="0" width=w height=H /> })}
            </svg>
            <p class="tip" id="timeline-tip" aria-live="polite">{move || drawn.get().3.map(|h| h.2).unwrap_or_else(|| "Point at a command to see its numbers.".into())}</p>
        </section>
    }
}

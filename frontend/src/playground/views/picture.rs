//! The picture in the step: beside a lesson's next step, the view that
//! carries the step just done. After an allocation, a `del`,
//! `empty_cache()` or a restart: the segment map, the blocks the step
//! changed outlined, and a click on a tensor's block `del`s its name. After
//! a training command: the timeline's newest slots, the step's own
//! highlighted with its peak inside it and where it settled.

use super::segments::{block_under, draw, in_words};
use crate::playground::state::App;
use leptos::html;
use leptos::prelude::*;
use vramlab_shared::alloc::BlockState;
use vramlab_shared::command::{Command, NameArgs};
use vramlab_shared::snapshot::{BlockSnapshot, SegmentSnapshot, Snapshot};
use vramlab_shared::units::format_size;

/// Which view carries a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Picture {
    Segments,
    Slot,
}

/// Training commands show their slot; the rest, the segments.
fn picture_for(command: &Command) -> Picture {
    match command {
        Command::Train(_)
        | Command::Forward(_)
        | Command::Backward(_)
        | Command::Step(_)
        | Command::ZeroGrad(_)
        | Command::FindBatchSize(_) => Picture::Slot,
        _ => Picture::Segments,
    }
}

/// The most blocks compared for marks (a lesson has a few dozen).
const MAX_COMPARED: usize = 4000;

/// Every block of the segments now: what a step's result is compared with.
pub fn blocks_now(app: App) -> Option<Vec<BlockSnapshot>> {
    app.memory.snapshot.with_untracked(|s| {
        let segments = &s.as_ref()?.segments;
        let blocks = segments.iter().flat_map(|g| g.blocks.iter());
        (blocks.clone().count() <= MAX_COMPARED).then(|| blocks.cloned().collect())
    })
}

/// Whether a block is not as it was before the step: a new tensor, or
/// memory the step freed.
fn changed(before: &[BlockSnapshot], b: &BlockSnapshot) -> bool {
    !before.contains(b)
}

/// The blocks a step changed, in words.
fn changes_in_words(before: &[BlockSnapshot], segments: &[SegmentSnapshot]) -> String {
    let words: Vec<String> = segments
        .iter()
        .flat_map(|g| g.blocks.iter())
        .filter(|b| changed(before, b))
        .take(8)
        .map(|b| match (b.state, &b.owner) {
            (BlockState::ActiveAllocated, Some(o)) => format!("{o} {}", format_size(b.size)),
            (BlockState::ActiveAllocated, None) => format!("a tensor {}", format_size(b.size)),
            (BlockState::Inactive, _) => format!("{} free", format_size(b.size)),
        })
        .collect();
    match words.is_empty() {
        true => "This step changed no block.".into(),
        false => format!("Outlined, what this step changed: {}.", words.join(", ")),
    }
}

/// The step just done's picture (none before the first step).
#[component]
pub fn StepPicture(app: App, index: usize, step: usize) -> impl IntoView {
    let done = step.checked_sub(1);
    let command = done.and_then(|d| App::lesson_line(index, d)?.command.ok());
    command.map(|c| match picture_for(&c) {
        Picture::Segments => view! { <StepSegments app=app /> }.into_any(),
        Picture::Slot => view! { <StepSlot app=app /> }.into_any(),
    })
}

/// The name to `del` for a block: the name its tensor is bound to, or why
/// there is none.
fn name_of(snapshot: &Snapshot, b: &BlockSnapshot) -> Result<String, String> {
    let owner = b.owner.as_deref().ok_or("a free block: nothing to del")?;
    let object = snapshot
        .objects
        .iter()
        .find(|o| o.label == owner && o.bytes > 0)
        .ok_or(format!("{owner} belongs to no name of yours"))?;
    object.names.first().cloned().ok_or(format!(
        "{owner} has no name left to del: kept alive by {}",
        object.kept_alive_by
    ))
}

#[component]
fn StepSegments(app: App) -> impl IntoView {
    let canvas = NodeRef::<html::Canvas>::new();
    let said = RwSignal::new(String::new());
    let before = app.display.before_step.get_value();
    let marks = before.clone();
    Effect::new(move |_| {
        app.memory.snapshot.track();
        let Some(c) = canvas.get() else {
            return;
        };
        let width = c.client_width().max(0) as u32;
        let marked = |b: &BlockSnapshot| marks.as_ref().is_some_and(|m| changed(m, b));
        app.memory.snapshot.with_untracked(|s| {
            s.as_ref()
                .and_then(|s| draw(&c, width, &s.segments, &marked))
        });
    });
    let click = move |e: web_sys::MouseEvent| {
        let Some(c) = canvas.get() else {
            return;
        };
        if app.read_only() {
            return;
        }
        let name = app.memory.snapshot.with_untracked(|s| {
            let s = s.as_ref()?;
            let b = block_under(&c, &e, &s.segments)?;
            Some(name_of(s, b))
        });
        match name {
            Some(Ok(name)) => {
                said.set(format!("del {name}"));
                app.run(Command::Del(NameArgs { name }));
            }
            Some(Err(why)) => said.set(why),
            None => said.set(String::new()),
        }
    };
    let caption = move || {
        let before = before.as_deref()?;
        app.memory
            .snapshot
            .with(|s| Some(changes_in_words(before, &s.as_ref()?.segments)))
    };
    view! {
        <figure class="step-picture" id="step-picture" data-picture="segments">
            <canvas id="step-segments" node_ref=canvas on:click=click
                aria-label="The segments after this step; click a tensor's block to del its name"></canvas>
            <figcaption>
                <span id="step-changes">{caption}</span>
                " "<span class="keys"><span class="mark-key"></span>" changed · "
                <span class="cached-key"></span>" cached · click a block to "<code>"del"</code>" its tensor"</span>
                " "<span id="step-picture-said" role="status">{move || said.get()}</span>
            </figcaption>
            <ul class="sr-only">
                {move || app.memory.snapshot.with(|s| s.as_ref().map(|s| s.segments.iter().take(20).map(|g| view! { <li>{in_words(g)}</li> }).collect::<Vec<_>>()))}
            </ul>
        </figure>
    }
}

/// Slots drawn: the step's and those before it.
const SLOTS: usize = 8;

#[component]
fn StepSlot(app: App) -> impl IntoView {
    let slots = move || {
        app.memory.history.with(|h| {
            let labelled: Vec<_> = h.iter().filter(|p| p.label.is_some()).cloned().collect();
            let from = labelled.len().saturating_sub(SLOTS);
            labelled[from..].to_vec()
        })
    };
    // Each slot a column: the pale bar its peak inside it, the dark one
    // where it settled, the line reserved (heights in % of the highest).
    let drawing = move || {
        let points = slots();
        let high = (points.iter())
            .map(|p| p.peak.max(p.allocated).max(p.reserved))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let pct = move |bytes: u64| format!("{:.1}%", bytes as f64 / high * 100.0);
        let newest = points.len().saturating_sub(1);
        points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let style = format!(
                    "--peak:{};--settled:{};--reserved:{}",
                    pct(p.peak.max(p.allocated)),
                    pct(p.allocated),
                    pct(p.reserved)
                );
                view! { <div class="slot" class:newest=i == newest style=style></div> }
            })
            .collect::<Vec<_>>()
    };
    let caption = move || {
        let last = slots().pop()?;
        let (step, name) = last.label.clone()?;
        Some(format!(
            "{name} (command {step}): allocated peaked at {} inside it and settled at {}; reserved {}.",
            format_size(last.peak.max(last.allocated)),
            format_size(last.allocated),
            format_size(last.reserved)
        ))
    };
    view! {
        <figure class="step-picture" id="step-picture" data-picture="slot">
            <div id="step-slot" class="slots" role="img" aria-label=move || caption().unwrap_or_default()>
                {drawing}
            </div>
            <figcaption>
                <span id="step-changes">{caption}</span>
                " "<span class="keys">"The timeline's newest slots, this step's framed: the pale bar is its peak inside it, the dark one where it settled, the line reserved."</span>
            </figcaption>
        </figure>
    }
}

//! The code cell: Python typed or pasted (or one of the popular pieces of
//! advice), run statement by statement on the kernel, with each
//! statement's state and, for the advice, which of its claims held.

use crate::playground::cell_state::{CellState, StepState};
use crate::playground::state::App;
use leptos::prelude::*;
use vramlab_shared::advice::{Run, ADVICE};
use vramlab_shared::protocol::python_worker::ToPython;
use vramlab_shared::units::format_size;

#[component]
pub fn CodeCell(app: App) -> impl IntoView {
    let cell = app.cell;
    let refused = RwSignal::new(None::<String>);
    let step = move |_| refused.set(run(app, 1).err());
    let run_all = move |_| {
        crate::playground::pyworker::interrupt(app);
        cell.forget();
        refused.set(run(app, usize::MAX).err());
    };
    let pick = move |e: leptos::ev::Event| {
        let i = event_target_value(&e).parse::<usize>().ok();
        let i = i.filter(|&i| i < ADVICE.len());
        cell.advice.set(i);
        if let Some(i) = i {
            cell.forget();
            fetch_advice(cell, i);
        }
    };
    view! {
        <section class="cell" aria-label="Python">
            <h2>"Python"</h2>
            <p class="hint">"Type or paste Python and run it: CPython runs it in the page with vramlab's torch, keras and jax, and after every statement the numbers follow."</p>
            <details class="understands">
                <summary>"What the cell runs"</summary>
                <p>"Python itself (classes, functions, loops, exceptions, print, gc): its objects die when CPython frees them. torch: tensors on the GPU, views, nn.Module with Linear and ReLU, vramlab's GPT and CNN (vramlab.models), peft's LoRA, optimizers, DataLoader, autocast, checkpointing, torch.cuda's numbers and OutOfMemoryError. Keras: Sequential, functional and subclassed models of Dense, fit, GradientTape, tf.data, clear_session. JAX: arrays, jax.random, jax.grad, optax, memory_stats(). A module not here (matplotlib, tqdm) runs as a stand-in, with a note. Values are shapes: no arithmetic but the engine's."</p>
            </details>
            <label for="advice">"Try the popular advice: "</label>
            <select id="advice" on:change=pick prop:value=move || cell.advice.get().map_or(String::new(), |i| i.to_string())>
                <option value="">"— your own code —"</option>
                {ADVICE.iter().enumerate().map(|(i, a)| view! { <option value=i.to_string()>{a.title}</option> }).collect_view()}
            </select>
            <textarea id="cell-source" rows="12" spellcheck="false" aria-label="Python code"
                prop:value=move || cell.source.get()
                on:input=move |e| { crate::playground::pyworker::interrupt(app); cell.source.set(event_target_value(&e)); cell.forget(); }
                disabled=move || app.read_only()></textarea>
            <div class="row">
                <button id="cell-step" on:click=step disabled=move || app.read_only() title="Run the next statement (the first restarts the kernel)">"Step ▸"</button>
                <button id="cell-run" on:click=run_all disabled=move || app.read_only() title="Restart the kernel and run every statement">"▶ Run all"</button>
                {move || cell.busy.get().map(|what| view! { <span class="busy" id="cell-busy" aria-live="polite">{what}</span> })}
                {move || cell.python.get().map(|what| view! { <span class="hint" id="cell-python">{what}</span> })}
                {move || refused.get().map(|why| view! { <span class="refused" role="alert" id="cell-refused">{why}</span> })}
                {move || cell.error.get().map(|why| view! { <span class="refused" role="alert" id="cell-error">{why}</span> })}
            </div>
            <Statements app=app />
            <Verdicts cell=cell />
        </section>
    }
}

/// Fetches advice `i`'s code (`advice/ID.py`, beside the page) into the
/// cell, unless another was picked meanwhile.
fn fetch_advice(cell: CellState, i: usize) {
    let url = crate::playground::lessons::advice_url(ADVICE[i].id);
    wasm_bindgen_futures::spawn_local(async move {
        match crate::files::fetch_text(url).await {
            Some(text) if cell.advice.get_untracked() == Some(i) => cell.source.set(text),
            Some(_) => {}
            None => cell.error.set(Some(
                "The advice's code could not be fetched: reload the page.".into(),
            )),
        }
    });
}

/// Runs up to `count` statements in the cell's Python; the first of a run
/// reads the code and restarts the kernel.
fn run(app: App, count: usize) -> Result<(), String> {
    if !app
        .link
        .status
        .with_untracked(crate::playground::state::Status::is_ready)
    {
        return Err("Not connected to the server: reconnecting; nothing was sent.".into());
    }
    let cell = app.cell;
    if cell.at_start() {
        cell.forget();
        let settings = app
            .link
            .hello
            .with_untracked(|h| h.as_ref().map(|h| serde_json::to_value(&h.settings)))
            .and_then(Result::ok)
            .unwrap_or_default();
        let code = cell.source.get_untracked();
        crate::playground::pyworker::post(app, &ToPython::Load { code, settings })?;
    }
    let count = count as u64;
    crate::playground::pyworker::post(app, &ToPython::Step { count })
}

/// The statements, each with its state, what it printed, and the numbers
/// after it; a statement that has run explains itself when clicked.
#[component]
fn Statements(app: App) -> impl IntoView {
    let cell = app.cell;
    let rows = move || cell.steps.get().into_iter().enumerate().collect::<Vec<_>>();
    view! {
        <ol id="cell-steps" class="statements">
            {move || rows().into_iter().map(|(i, s)| {
                let (class, mark, why) = match &s.state {
                    StepState::Waiting => ("waiting", " ", String::new()),
                    StepState::Running => ("running", "…", String::new()),
                    StepState::Done => ("done", "✓", String::new()),
                    StepState::Failed(m) => ("failed", "✗", m.clone()),
                };
                let next = cell.next.get() == i && s.state == StepState::Waiting;
                let selected = move || cell.selected.get() == Some(i);
                let after = s.after.as_ref().map(|a| format!("allocated {}", format_size(a.allocated_bytes)));
                view! {
                    <li class=class class:next=next class:selected=selected data-state=class id=format!("cell-step-{i}")>
                        <button class="stmt" aria-pressed=move || selected().to_string() disabled=after.is_none()
                            title="Explain what this statement changed" on:click=move |_| app.explain_statement(i)>
                            <span class="mark" aria-hidden="true">{mark}</span>
                            <span class="ln">{format!("{}", s.lines.0)}</span>
                            <code>{s.source.clone()}</code>
                        </button>
                        {after.map(|a| view! { <span class="after">{a}</span> })}
                        {(!s.output.is_empty()).then(|| view! { <pre class="out">{s.output.clone()}</pre> })}
                        {(!s.errors.is_empty()).then(|| view! { <pre class="err">{s.errors.clone()}</pre> })}
                        {(!why.is_empty()).then(|| view! { <pre class="why" role="alert">{why}</pre> })}
                    </li>
                }
            }).collect_view()}
        </ol>
    }
}

/// The advice's claims, judged once the run reaches the statements they name.
#[component]
fn Verdicts(cell: CellState) -> impl IntoView {
    let verdicts = move || {
        let advice = &ADVICE[cell.advice.get()?];
        let numbers = cell.numbers();
        Some(
            advice
                .claims
                .iter()
                .map(|c| (c.text, c.judge(&numbers as &dyn Run)))
                .collect::<Vec<_>>(),
        )
    };
    view! {
        <div id="verdicts" class="verdicts" aria-live="polite">
            {move || verdicts().map(|v| view! {
                <h3>"What the advice claims, and what happened"</h3>
                <ul>
                    {v.into_iter().enumerate().map(|(i, (text, verdict))| {
                        let (class, mark, because) = match verdict {
                            Some(v) if v.held => ("held", "true", v.because),
                            Some(v) => ("failed", "false", v.because),
                            None => ("open", "not run yet", String::new()),
                        };
                        view! { <li class=class id=format!("claim-{i}")><b>{mark}</b>": " {text} <span class="because">{because}</span></li> }
                    }).collect_view()}
                </ul>
            })}
        </div>
    }
}

//! The vramlab web app. For now: a command runner on the simulated GPU,
//! executed by the shared engine inside the browser (no server round trip),
//! showing the three numbers after every command.

use leptos::prelude::*;
use vramlab_shared::units::format_size;
use vramlab_shared::{Engine, StepRecord};

const FIRST_LESSON: &str = include_str!("../../tests/lessons/01-del-vs-empty-cache.jsonl");

/// The lesson's commands without their annotations, one per line.
fn lesson_commands(text: &str) -> String {
    text.lines()
        .filter_map(|l| {
            let parsed = vramlab_shared::protocol::parse_line(l);
            parsed.command.ok()?;
            Some(parsed.raw.to_string())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn run_all(text: &str) -> Vec<StepRecord> {
    let mut engine = Engine::new_simulated();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| engine.run_line(l))
        .collect()
}

#[component]
fn App() -> impl IntoView {
    let (commands, set_commands) = signal(lesson_commands(FIRST_LESSON));
    let (records, set_records) = signal(Vec::<StepRecord>::new());
    let run = move |_| set_records.set(run_all(&commands.get()));
    view! {
        <main>
            <h1>"vramlab"</h1>
            <p class="tagline">
                "How PyTorch, TensorFlow and JAX hold and release GPU memory: allocated, reserved, and what nvidia-smi shows. "
                <span class="sim">"simulated GPU, running in your browser"</span>
            </p>
            <label for="commands">"Commands, one JSON object per line"</label>
            <textarea
                id="commands"
                rows="10"
                prop:value=commands
                on:input=move |ev| set_commands.set(event_target_value(&ev))
            ></textarea>
            <button id="run" on:click=run>"Run"</button>
            <table id="results" aria-live="polite">
                <thead>
                    <tr>
                        <th>"step"</th>
                        <th>"command"</th>
                        <th class="allocated">"allocated"</th>
                        <th class="reserved">"reserved"</th>
                        <th class="device">"nvidia-smi"</th>
                        <th>"what happened"</th>
                    </tr>
                </thead>
                <tbody>
                    <For
                        each=move || records.get()
                        key=|r| r.step
                        children=move |r| {
                            let text = r
                                .error
                                .as_ref()
                                .map(|e| e.message.clone())
                                .or(r.note.clone())
                                .unwrap_or_default();
                            view! {
                                <tr class:error=!r.ok>
                                    <td class="num">{r.step}</td>
                                    <td><code>{r.cmd.to_string()}</code></td>
                                    <td class="num allocated">{format_size(r.stats.allocated_bytes)}</td>
                                    <td class="num reserved">{format_size(r.stats.reserved_bytes)}</td>
                                    <td class="num device">{format_size(r.stats.device_used_bytes)}</td>
                                    <td>{text}</td>
                                </tr>
                            }
                        }
                    />
                </tbody>
            </table>
        </main>
    }
}

fn main() {
    leptos::mount::mount_to_body(App);
}

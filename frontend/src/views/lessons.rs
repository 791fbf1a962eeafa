//! The lessons: a list, then one step at a time with its Python and the
//! check of what the step should show.

use crate::lessons::LESSONS;
use crate::state::{App, LessonRun};
use leptos::prelude::*;

#[component]
pub fn Lessons(app: App) -> impl IntoView {
    let start = move |index: usize| {
        app.lesson.set(Some(LessonRun {
            index,
            step: 0,
            outcome: None,
        }));
        app.save_url();
    };
    let current = move || {
        app.lesson.get().map(|run| {
            let lesson = &LESSONS[run.index];
            let lines = lesson.lines();
            let line = lines.get(run.step).copied();
            let parsed = line.map(vramlab_shared::command::parse_line);
            let say = parsed
                .as_ref()
                .and_then(|p| p.annotations.say.clone())
                .unwrap_or_default();
            let done = line.is_none();
            let code = parsed
                .as_ref()
                .and_then(|p| p.command.as_ref().ok())
                .map(|c| vramlab_shared::python::code(c, app.framework()))
                .unwrap_or_default();
            (run.clone(), lesson.title(), lines.len(), say, done, code)
        })
    };
    view! {
        <section class="lessons" aria-label="Lessons" id="lessons">
            <h2>"Lessons"</h2>
            {move || match current() {
                None => view! {
                    <ol class="lesson-list">
                        {LESSONS.iter().enumerate().map(|(i, l)| view! {
                            <li><button class="link" id=format!("lesson-{i}") on:click=move |_| start(i)>{l.title()}</button></li>
                        }).collect::<Vec<_>>()}
                    </ol>
                }.into_any(),
                Some((run, title, total, say, done, code)) => view! {
                    <div class="lesson">
                        <h3>{title}</h3>
                        {run.outcome.clone().map(|(ok, why)| view! {
                            <p class="outcome" class:bad=!ok id="lesson-outcome">{if ok { "✓ " } else { "✗ " }}{why}</p>
                        })}
                        {if done {
                            view! { <p id="lesson-done">"Lesson complete."</p> }.into_any()
                        } else {
                            view! {
                                <p class="step">{format!("Step {} of {}: ", run.step + 1, total)}<b id="lesson-say">{say}</b></p>
                                <pre class="step-code">{code}</pre>
                                <button id="lesson-do" disabled=move || app.read_only() on:click=move |_| {
                                    if let Some(line) = App::lesson_line(run.index, run.step) { app.submit(line); }
                                }>"Do this step"</button>
                            }.into_any()
                        }}
                        <button class="link" on:click=move |_| { app.lesson.set(None); app.save_url(); }>"All lessons"</button>
                    </div>
                }.into_any(),
            }}
        </section>
    }
}

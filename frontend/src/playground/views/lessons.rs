//! The lessons: the first screen (what vramlab shows, the lessons by their
//! question, the words it uses), then one step at a time: its Python, a
//! prediction asked before it runs, the check of what it showed, the
//! progress, and at the end what was seen and the next lesson.

use super::glossary::Glossary;
use super::picture::{blocks_now, StepPicture};
use crate::playground::lessons::{Lesson, LESSONS};
use crate::playground::state::{App, LessonRun};
use leptos::prelude::*;
use vramlab_shared::command::{parse_line, Command};
use vramlab_shared::lesson::predict::{number_to_predict, Direction};

/// Text with `code` spans drawn as code.
pub fn inline_code(text: &str) -> Vec<AnyView> {
    text.split('`')
        .enumerate()
        .map(|(i, part)| {
            let part = part.to_string();
            if i % 2 == 1 {
                view! { <code>{part}</code> }.into_any()
            } else {
                part.into_any()
            }
        })
        .collect()
}

/// Whether a step's words are just its code (quotes aside).
fn same_code(say: &str, code: &str) -> bool {
    say.trim().replace('\'', "\"") == code.trim().replace('\'', "\"")
}

fn start(app: App, index: usize) {
    app.display.before_step.set_value(None);
    app.lesson.set(Some(LessonRun::at(index, 0)));
    app.save_url();
}

#[component]
pub fn Lessons(app: App) -> impl IntoView {
    view! {
        <section class="lessons" aria-label="Lessons" id="lessons">
            {move || match app.lesson.get() {
                None => view! { <FirstScreen app=app /> }.into_any(),
                Some(run) if app.lesson_file(run.index) => view! { <Playing app=app run=run /> }.into_any(),
                Some(run) if crate::playground::lessons::failed(run.index) => view! {
                    <p class="outcome bad" id="lesson-loading" role="alert">"This lesson's steps could not be fetched (lessons/"{LESSONS[run.index].slug}".jsonl): reload the page to try again."</p>
                }.into_any(),
                Some(_) => view! { <p class="note" id="lesson-loading">"Loading the lesson…"</p> }.into_any(),
            }}
        </section>
    }
}

#[component]
fn FirstScreen(app: App) -> impl IntoView {
    let unknown = crate::playground::url::unknown_lesson().map(|name| {
        format!(
            "There is no lesson “{name}”: pick one of the {} below.",
            LESSONS.len()
        )
    });
    view! {
        <h2 id="start-here">"Start here"</h2>
        <p class="note" id="unknown-lesson" hidden=unknown.is_none()>{unknown.clone().unwrap_or_default()}</p>
        <p class="lead">"vramlab runs the memory rules of PyTorch, TensorFlow and JAX on a GPU (real or simulated) and shows, number by number, what "
            <code>"del"</code>", "<code>"gc.collect()"</code>", "<code>"clear_session()"</code>" and "<code>"empty_cache()"</code>
            " really give back. Pick a question:"</p>
        <ol class="lesson-list">
            {LESSONS.iter().enumerate().map(|(i, l)| view! {
                <li>
                    <button class="link question" id=format!("lesson-{i}") on:click=move |_| start(app, i)>{inline_code(l.question)}</button>
                    <span class="summary">{inline_code(l.summary)}</span>
                </li>
            }).collect::<Vec<_>>()}
        </ol>
        <Glossary />
    }
}

#[component]
fn Playing(app: App, run: LessonRun) -> impl IntoView {
    let lesson: &'static Lesson = &LESSONS[run.index];
    let total = crate::playground::lessons::lines(run.index).len();
    let done = run.step >= total;
    view! {
        <h2 class="lesson-title">{inline_code(lesson.question)}</h2>
        <p class="progress-line">
            <progress id="lesson-progress" max=total value=run.step.min(total)></progress>
            <span>{if done { format!("all {total} steps done") } else { format!("step {} of {total}", run.step + 1) }}</span>
        </p>
        // With a prediction, its verdict comes first and carries the mark
        // (right or wrong); the step's outcome is then its explanation.
        {run.guessed.clone().map(|(right, words)| view! {
            <p class="guessed" class:bad=!right id="guess-verdict">{if right { "✓ " } else { "✗ " }}{words}</p>
        })}
        {run.outcome.clone().map(|(ok, why)| {
            let mark = match (ok, run.guessed.is_some()) {
                (false, _) => "✗ ",
                (true, false) => "✓ ",
                (true, true) => "",
            };
            view! { <p class="outcome" class:bad=!ok id="lesson-outcome">{mark}{why}</p> }
        })}
        <StepPicture app=app index=run.index step=run.step />
        {if done {
            view! { <Finished app=app index=run.index /> }.into_any()
        } else {
            view! { <NextStep app=app run=run.clone() /> }.into_any()
        }}
        <p class="lesson-nav">
            <button class="link" id="lesson-all" on:click=move |_| { app.lesson.set(None); app.save_url(); }>"All lessons"</button>
            " · "<CopyLink />
            " · "<AsPython app=app index=run.index />
        </p>
    }
}

/// Copies the address of this step (the URL keeps the lesson and step);
/// where the browser refuses the clipboard, shows the link to copy by hand.
#[component]
fn CopyLink() -> impl IntoView {
    // The link, and whether the clipboard took it.
    let said = RwSignal::new(None::<(String, bool)>);
    let copy = move |_| {
        let Some(w) = web_sys::window() else { return };
        let Ok(href) = w.location().href() else {
            return;
        };
        let written = w.navigator().clipboard().write_text(&href);
        wasm_bindgen_futures::spawn_local(async move {
            let copied = wasm_bindgen_futures::JsFuture::from(written).await.is_ok();
            said.set(Some((href, copied)));
        });
    };
    view! {
        <button class="link" id="lesson-link" on:click=copy>"copy a link to this step"</button>
        <span role="status" id="lesson-link-said">{move || said.get().map(|(href, copied)| if copied {
            view! { " copied" }.into_any()
        } else {
            view! { " copy it from here: "<input readonly id="lesson-link-text" value=href aria-label="Link to this step" /> }.into_any()
        })}</span>
    }
}

#[component]
fn NextStep(app: App, run: LessonRun) -> impl IntoView {
    let parsed = App::lesson_line(run.index, run.step).unwrap_or_else(|| parse_line(""));
    let say = parsed.annotations.say.clone().unwrap_or_default();
    let code = parsed
        .command
        .as_ref()
        .ok()
        .map(|c| vramlab_shared::python::code(c, app.framework()))
        .unwrap_or_default();
    let expect = parsed.annotations.expect.clone().unwrap_or_default();
    let restart = matches!(
        parsed.command,
        Ok(vramlab_shared::command::Command::Restart(_))
    );
    let number = (!restart)
        .then(|| {
            app.memory
                .stats
                .get()
                .and_then(|s| number_to_predict(&expect, &s))
        })
        .flatten();
    let (index, step, guess) = (run.index, run.step, run.guess);
    let choose = move |d: Direction| {
        app.lesson.update(|l| {
            if let Some(l) = l {
                l.guess = Some(d);
            }
        })
    };
    view! {
        // What to do, in words, unless the words are the code itself.
        <p class="step" hidden=same_code(&say, &code)><b id="lesson-say">{say.clone()}</b></p>
        <pre class="step-code" id="lesson-code">{code.clone()}</pre>
        {number.map(|n| view! {
            <div class="predict" role="group" aria-label="Your prediction">
                <span>"Before you run it: what will "<b>{n.label()}</b>" do? "</span>
                {Direction::ALL.map(|d| view! {
                    <button id=format!("guess-{}", d.word()) class="guess" aria-pressed=(guess == Some(d)).to_string()
                        on:click=move |_| choose(d)>{d.word()}</button>
                })}
            </div>
        })}
        <button id="lesson-do" class="primary" disabled=move || app.read_only() on:click=move |_| {
            if let Some(line) = App::lesson_line(index, step) {
                app.display.before_step.set_value(blocks_now(app));
                app.submit(line);
            }
        }>"Do this step"</button>
    }
}

#[component]
fn Finished(app: App, index: usize) -> impl IntoView {
    let next = LESSONS.get(index + 1);
    view! {
        <div class="finished">
            <p id="lesson-done"><b>"Lesson complete. "</b>"What you saw:"</p>
            <p id="lesson-recap">{inline_code(crate::playground::lessons::recap(index))}</p>
            {next.map(|n| view! {
                <p>"Next: "<button id="lesson-next" class="link question" on:click=move |_| start(app, index + 1)>{inline_code(n.question)}</button></p>
            })}
        </div>
    }
}

/// The lesson as Python in the code cell: one file per kernel (a restart
/// in the lesson starts the next, `vramlab lesson-python` writes them);
/// opening one runs the lesson's restarts up to that kernel's on the
/// session, so it has the kernel's settings, and puts the code in the
/// cell, for ▶ Run all.
#[component]
fn AsPython(app: App, index: usize) -> impl IntoView {
    let lines = crate::playground::lessons::lines(index);
    let restarts: Vec<usize> = (0..lines.len())
        .filter(|&i| {
            matches!(
                App::lesson_line(index, i).map(|l| l.command),
                Some(Ok(Command::Restart(_)))
            )
        })
        .collect();
    let kernels = LESSONS[index].python.len();
    let said = RwSignal::new(None::<String>);
    let open = move |k: usize| {
        for &i in restarts.iter().take(k + 1) {
            if let Some(line) = App::lesson_line(index, i) {
                app.submit(line);
            }
        }
        let Some(url) = crate::playground::lessons::python_url(index, k) else {
            return;
        };
        wasm_bindgen_futures::spawn_local(async move {
            match crate::files::fetch_text(&url).await {
                Some(code) => {
                    said.set(None);
                    app.cell.show_code(code);
                    if let Some(e) = web_sys::window()
                        .and_then(|w| w.document())
                        .and_then(|d| d.get_element_by_id("cell-source"))
                    {
                        e.scroll_into_view();
                    }
                }
                None => said.set(Some(
                    "The lesson's Python could not be fetched: reload the page.".into(),
                )),
            }
        });
    };
    let open = std::rc::Rc::new(open);
    view! {
        <span class="as-python">"as Python in the cell: "
            {(0..kernels).map(|k| {
                let open = open.clone();
                let label = match kernels {
                    1 => "open".to_string(),
                    _ => format!("kernel {}", k + 1),
                };
                view! {
                    <button class="link" id=format!("lesson-python-{k}") disabled=move || app.read_only()
                        title="The steps as Python in the cell, the session restarted with their settings"
                        on:click=move |_| open(k)>{label}</button>" "
                }
            }).collect_view()}
            <span role="alert" class="refused">{move || said.get()}</span>
        </span>
    }
}

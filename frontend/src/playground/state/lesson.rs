//! A lesson played in the page: the link's step caught up on a fresh
//! kernel, each step's result checked against the lesson's expectations
//! and the learner's prediction, the framework a link asks for.

use super::{App, Pending};
use leptos::prelude::*;
use vramlab_shared::command::{parse_line, Command, CommandLine, RestartSettings};
use vramlab_shared::lesson::check_step;
use vramlab_shared::lesson::predict::{self, Direction};
use vramlab_shared::protocol::StepRecord;

/// A lesson being played.
#[derive(Clone, Debug, PartialEq)]
pub struct LessonRun {
    pub index: usize,
    pub step: usize,
    /// The outcome of the last checked step: passed, and the words.
    pub outcome: Option<(bool, String)>,
    /// The learner's prediction for the step about to run.
    pub guess: Option<Direction>,
    /// How the last prediction went: right, and the words.
    pub guessed: Option<(bool, String)>,
}

impl LessonRun {
    /// Step `step` of lesson `index`, nothing checked or guessed yet.
    pub fn at(index: usize, step: usize) -> Self {
        LessonRun {
            index,
            step,
            outcome: None,
            guess: None,
            guessed: None,
        }
    }
}

impl App {
    /// The step the lesson being played is at (0 with none).
    pub(super) fn lesson_step(&self) -> usize {
        self.lesson
            .with_untracked(|l| l.as_ref().map_or(0, |l| l.step))
    }

    /// A link to step N of a lesson (or a kernel that lost its state while
    /// the lesson was at step N): the steps before it run again, from the
    /// lesson's own restart, so the kernel is where the step expects it.
    pub(super) fn catch_up_lesson(&self) {
        let Some(run) = self.lesson.get_untracked() else {
            return;
        };
        if !crate::playground::lessons::loaded(run.index) {
            let app = *self;
            return crate::playground::lessons::load(run.index, move |here| {
                app.lesson_texts.update(|n| *n += 1);
                if here {
                    app.catch_up_lesson();
                }
            });
        }
        let step = run
            .step
            .min(crate::playground::lessons::lines(run.index).len());
        self.display.before_step.set_value(None);
        self.lesson.set(Some(LessonRun::at(run.index, 0)));
        for step in 0..step {
            if let Some(line) = Self::lesson_line(run.index, step) {
                self.submit(line);
            }
        }
    }

    /// Whether lesson `index`'s commands are here (tracked); fetches them
    /// when they are not, for the views to show once they come.
    pub fn lesson_file(&self, index: usize) -> bool {
        self.lesson_texts.track();
        let here = crate::playground::lessons::loaded(index);
        if !here && !crate::playground::lessons::failed(index) {
            let texts = self.lesson_texts;
            crate::playground::lessons::load(index, move |_| texts.update(|n| *n += 1));
        }
        here
    }

    /// `?framework=` in the link: a kernel of that framework.
    pub(super) fn apply_wanted_framework(&self) {
        if let Some(f) = self.link.wanted_framework.get_untracked() {
            if f != self.framework() {
                self.run(Command::Restart(RestartSettings {
                    framework: Some(f),
                    ..Default::default()
                }));
            }
        }
    }

    /// A lesson step's line, annotations split off.
    pub fn lesson_line(index: usize, step: usize) -> Option<CommandLine> {
        let line = crate::playground::lessons::lines(index)
            .get(step)
            .copied()?;
        Some(parse_line(line))
    }

    pub(super) fn check_lesson(&self, sent: &Pending, record: &StepRecord) {
        let Some(run) = self.lesson.get_untracked() else {
            return;
        };
        let Some(parsed) = Self::lesson_line(run.index, run.step) else {
            return;
        };
        if parsed.command.as_ref() != Ok(&sent.command) {
            // A restart the lesson did not ask for empties the kernel the
            // lesson stands on: it starts again from its first step.
            if matches!(sent.command, Command::Restart(_)) && run.step > 0 {
                self.lesson.set(Some(LessonRun {
                    outcome: Some((
                        false,
                        "The kernel restarted: the lesson starts again from its first step.".into(),
                    )),
                    ..LessonRun::at(run.index, 0)
                }));
                self.save_url();
            }
            return;
        }
        let expect = parsed.annotations.expect.unwrap_or_default();
        let guessed = run.guess.and_then(|guess| {
            let number = predict::number_to_predict(&expect, &sent.before)?;
            Some(predict::verdict(number, guess, &sent.before, &record.stats))
        });
        let mismatches = check_step(&expect.into_iter().collect(), record);
        // A step with no words of its own says what the engine said.
        let why = parsed
            .annotations
            .why
            .or_else(|| record.note.clone())
            .unwrap_or_default();
        let outcome = if mismatches.is_empty() {
            (true, why)
        } else {
            let what: Vec<String> = mismatches
                .iter()
                .map(|m| {
                    format!(
                        "{} was {} (the lesson expects {})",
                        m.key, m.actual, m.expected
                    )
                })
                .collect();
            (false, format!("{} {why}", what.join("; ")))
        };
        self.lesson.set(Some(LessonRun {
            outcome: Some(outcome),
            guessed,
            ..LessonRun::at(run.index, run.step + 1)
        }));
        self.save_url();
    }
}

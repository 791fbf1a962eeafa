//! The lessons: their question and summary built in, their commands
//! (`NN-slug.jsonl`, the files the tests play) and recap (`NN-slug.md`'s
//! "What you saw") fetched from the web app's `lessons/` folder when a
//! lesson opens, its Python (`NN-slug.kN.py`) when asked for: not part of
//! the page's first download.

use std::cell::RefCell;

pub struct Lesson {
    pub slug: &'static str,
    /// The question the lesson answers, its title.
    pub question: &'static str,
    /// What the learner will do, in a sentence or two.
    pub summary: &'static str,
    /// The commands file's version (a hash of its text), in its URL.
    pub version: &'static str,
    /// The words file's version: its recap (what the learner saw) comes
    /// with the commands.
    pub recap: &'static str,
    /// Each kernel's Python file's version (`NN-slug.k1.py`, …).
    pub python: &'static [&'static str],
}

// LESSONS: every file in tests/lessons/, in name order (written by build.rs).
include!(concat!(env!("OUT_DIR"), "/lessons.rs"));

/// Where a lesson's commands file is.
enum File {
    Missing,
    /// Being fetched: what to call when it comes (or does not).
    Loading(Vec<Box<dyn FnOnce(bool)>>),
    /// Its commands and its recap.
    Here(&'static str, &'static str),
    /// The fetch failed: said, not retried in a loop.
    Failed,
}

thread_local! {
    /// Each lesson's commands file.
    static FILES: RefCell<Vec<File>> = RefCell::new(LESSONS.iter().map(|_| File::Missing).collect());
}

/// Lesson `index`'s steps, once its file is here (none before).
pub fn lines(index: usize) -> Vec<&'static str> {
    let text = FILES.with(|f| match f.borrow().get(index) {
        Some(File::Here(text, _)) => *text,
        _ => "",
    });
    text.lines().filter(|l| !l.trim().is_empty()).collect()
}

/// Whether lesson `index`'s file is here.
pub fn loaded(index: usize) -> bool {
    FILES.with(|f| matches!(f.borrow().get(index), Some(File::Here(..))))
}

/// Whether fetching lesson `index`'s file failed.
pub fn failed(index: usize) -> bool {
    FILES.with(|f| matches!(f.borrow().get(index), None | Some(File::Failed)))
}

/// Fetches lesson `index`'s file (once: calls while it is on its way wait
/// for the same fetch), then calls `then` with whether it is here.
pub fn load(index: usize, then: impl FnOnce(bool) + 'static) {
    let fetch = FILES.with(|f| match f.borrow_mut().get_mut(index) {
        Some(File::Loading(waiting)) => {
            waiting.push(Box::new(then));
            None
        }
        Some(file @ File::Missing) => {
            *file = File::Loading(vec![Box::new(then)]);
            Some(None)
        }
        Some(File::Here(..)) => Some(Some((then, true))),
        _ => Some(Some((then, false))),
    });
    match fetch {
        Some(Some((then, here))) => then(here),
        Some(None) => spawn_fetch(index),
        None => {}
    }
}

/// Lesson `index`'s recap, once its files are here.
pub fn recap(index: usize) -> &'static str {
    FILES.with(|f| match f.borrow().get(index) {
        Some(File::Here(_, recap)) => *recap,
        _ => "",
    })
}

/// Where kernel `k` (from 0) of lesson `index` is as Python.
pub fn python_url(index: usize, k: usize) -> Option<String> {
    let lesson = &LESSONS[index];
    let version = lesson.python.get(k)?;
    Some(format!("lessons/{}.k{}.py?v={version}", lesson.slug, k + 1))
}

fn spawn_fetch(index: usize) {
    let lesson = &LESSONS[index];
    let commands = format!("lessons/{}.jsonl?v={}", lesson.slug, lesson.version);
    let words = format!("lessons/{}.md?v={}", lesson.slug, lesson.recap);
    wasm_bindgen_futures::spawn_local(async move {
        let fetch = crate::files::fetch_text;
        // The words only when the commands came: a failed fetch is one.
        let text = fetch(&commands).await;
        let words = match text {
            Some(_) => fetch(&words).await,
            None => None,
        };
        let file = match (text, words) {
            (Some(text), Some(words)) => {
                let recap = words.split_once("## What you saw").map_or("", |(_, r)| r);
                let recap = recap.split_whitespace().collect::<Vec<_>>().join(" ");
                File::Here(leak(text), leak(recap))
            }
            _ => File::Failed,
        };
        let here = matches!(file, File::Here(..));
        let waiting = FILES.with(|f| std::mem::replace(&mut f.borrow_mut()[index], file));
        if let File::Loading(waiting) = waiting {
            waiting.into_iter().for_each(|then| then(here));
        }
    });
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

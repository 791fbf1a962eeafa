//! The lessons: their words built in (`NN-slug.md`: question, summary,
//! recap), their commands (`NN-slug.jsonl`, the files the tests play)
//! fetched from the web app's `lessons/` folder when a lesson opens: a few
//! hundred bytes each, not part of the page's first download.

use std::cell::RefCell;

pub struct Lesson {
    pub slug: &'static str,
    /// The question the lesson answers, its title.
    pub question: &'static str,
    /// What the learner will do, in a sentence or two.
    pub summary: &'static str,
    /// What the learner saw, shown at the end.
    pub recap: &'static str,
    /// The commands file's version (a hash of its text), in its URL.
    pub version: &'static str,
}

// LESSONS: every file in tests/lessons/, in name order (written by build.rs).
include!(concat!(env!("OUT_DIR"), "/lessons.rs"));

/// Where a lesson's commands file is.
enum File {
    Missing,
    /// Being fetched: what to call when it comes (or does not).
    Loading(Vec<Box<dyn FnOnce(bool)>>),
    Here(&'static str),
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
        Some(File::Here(text)) => *text,
        _ => "",
    });
    text.lines().filter(|l| !l.trim().is_empty()).collect()
}

/// Whether lesson `index`'s file is here.
pub fn loaded(index: usize) -> bool {
    FILES.with(|f| matches!(f.borrow().get(index), Some(File::Here(_))))
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
        Some(File::Here(_)) => Some(Some((then, true))),
        _ => Some(Some((then, false))),
    });
    match fetch {
        Some(Some((then, here))) => then(here),
        Some(None) => spawn_fetch(index),
        None => {}
    }
}

fn spawn_fetch(index: usize) {
    let lesson = &LESSONS[index];
    let url = format!("lessons/{}.jsonl?v={}", lesson.slug, lesson.version);
    wasm_bindgen_futures::spawn_local(async move {
        let file = match crate::files::fetch_text(&url).await {
            Some(text) => File::Here(Box::leak(text.into_boxed_str())),
            None => File::Failed,
        };
        let here = matches!(file, File::Here(_));
        let waiting = FILES.with(|f| std::mem::replace(&mut f.borrow_mut()[index], file));
        if let File::Loading(waiting) = waiting {
            waiting.into_iter().for_each(|then| then(here));
        }
    });
}

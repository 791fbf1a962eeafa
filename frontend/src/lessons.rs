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

thread_local! {
    /// The commands files fetched so far, by lesson.
    static TEXTS: RefCell<Vec<Option<&'static str>>> = RefCell::new(vec![None; LESSONS.len()]);
}

/// Lesson `index`'s steps, once its file is here (none before).
pub fn lines(index: usize) -> Vec<&'static str> {
    let text = TEXTS.with(|t| t.borrow().get(index).copied().flatten());
    let text = text.unwrap_or_default();
    text.lines().filter(|l| !l.trim().is_empty()).collect()
}

/// Whether lesson `index`'s file is here.
pub fn loaded(index: usize) -> bool {
    TEXTS.with(|t| t.borrow().get(index).is_some_and(Option::is_some))
}

/// Fetches lesson `index`'s file (once), then calls `then` with whether
/// it is here.
pub fn load(index: usize, then: impl FnOnce(bool) + 'static) {
    if loaded(index) {
        return then(true);
    }
    let Some(lesson) = LESSONS.get(index) else {
        return then(false);
    };
    let url = format!("lessons/{}.jsonl?v={}", lesson.slug, lesson.version);
    wasm_bindgen_futures::spawn_local(async move {
        let text = crate::files::fetch_text(&url).await;
        if let Some(text) = text {
            let text: &'static str = Box::leak(text.into_boxed_str());
            TEXTS.with(|t| t.borrow_mut()[index] = Some(text));
        }
        then(loaded(index));
    });
}

//! The lesson files, built in: the same files the tests play, with the
//! words written for each (`NN-slug.md`: its question, summary and recap).

pub struct Lesson {
    pub slug: &'static str,
    /// The question the lesson answers, its title.
    pub question: &'static str,
    /// What the learner will do, in a sentence or two.
    pub summary: &'static str,
    /// What the learner saw, shown at the end.
    pub recap: &'static str,
    pub text: &'static str,
}

// LESSONS: every file in tests/lessons/, in name order (written by build.rs).
include!(concat!(env!("OUT_DIR"), "/lessons.rs"));

impl Lesson {
    pub fn lines(&self) -> Vec<&'static str> {
        self.text.lines().filter(|l| !l.trim().is_empty()).collect()
    }
}

//! The lesson files, built in: the same files the tests play.

pub struct Lesson {
    pub slug: &'static str,
    pub text: &'static str,
}

// LESSONS: every file in tests/lessons/, in name order (written by build.rs).
include!(concat!(env!("OUT_DIR"), "/lessons.rs"));

impl Lesson {
    /// "Del vs empty cache" from "01-del-vs-empty-cache".
    pub fn title(&self) -> String {
        let words = self
            .slug
            .split_once('-')
            .map_or(self.slug, |(_, rest)| rest);
        let mut t = words.replace('-', " ");
        if let Some(first) = t.get_mut(0..1) {
            first.make_ascii_uppercase();
        }
        t
    }

    pub fn lines(&self) -> Vec<&'static str> {
        self.text.lines().filter(|l| !l.trim().is_empty()).collect()
    }
}

//! The lesson files, built in: the same files the tests play.

pub struct Lesson {
    pub slug: &'static str,
    pub text: &'static str,
}

macro_rules! lessons {
    ($($slug:literal),* $(,)?) => {
        &[$(Lesson {
            slug: $slug,
            text: include_str!(concat!("../../tests/lessons/", $slug, ".jsonl")),
        }),*]
    };
}

pub const LESSONS: &[Lesson] = lessons![
    "01-del-vs-empty-cache",
    "02-cycle-needs-gc",
    "03-tensorflow-pool-stays",
    "04-jax-preallocation",
    "05-fragmentation-oom",
    "06-activations-and-batch-size",
    "07-optimizer-state",
    "08-set-to-none",
    "09-loss-history-leak",
    "10-keras-models-in-a-loop",
    "11-tf1-session-close",
    "12-last-exception",
    "13-checkpointing",
    "14-find-batch-size",
];

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

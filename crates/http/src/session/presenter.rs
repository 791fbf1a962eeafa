//! What the owner's page shows beyond the numbers (lesson step, code cell,
//! explanation, controls), kept for the session and passed to watchers:
//! the latest one goes to a watcher when it joins. Updates are rate
//! limited on their own, so mirroring never costs the session a command.

use crate::rate::RateLimit;

/// Presenter updates a second (the page sends at most one every 200 ms).
const UPDATES_PER_SECOND: u32 = 10;

pub struct Presenter<W> {
    latest: Option<W>,
    rate: RateLimit,
}

impl<W: Clone> Presenter<W> {
    pub fn new() -> Self {
        Presenter {
            latest: None,
            rate: RateLimit::new(UPDATES_PER_SECOND),
        }
    }

    /// Keeps an update; false when updates come faster than the limit.
    pub fn update(&mut self, wire: W) -> bool {
        if !self.rate.allow() {
            return false;
        }
        self.latest = Some(wire);
        true
    }

    pub fn latest(&self) -> Option<W> {
        self.latest.clone()
    }
}

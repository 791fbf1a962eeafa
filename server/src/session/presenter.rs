//! What the owner's page shows beyond the numbers (lesson step, code cell,
//! explanation, controls), kept for the session and passed to watchers:
//! the latest one goes to a watcher when it joins. Updates are rate
//! limited on their own, so mirroring never costs the session a command.

use crate::rate::RateLimit;
use std::sync::Mutex;

/// Presenter updates a second (the page sends at most one every 200 ms).
const UPDATES_PER_SECOND: u32 = 10;

pub struct Presenter<W> {
    latest: Mutex<Option<W>>,
    rate: Mutex<RateLimit>,
}

impl<W: Clone> Presenter<W> {
    pub fn new() -> Self {
        Presenter {
            latest: Mutex::new(None),
            rate: Mutex::new(RateLimit::new(UPDATES_PER_SECOND)),
        }
    }

    /// Keeps an update; false when updates come faster than the limit.
    pub fn update(&self, wire: W) -> bool {
        if !self.rate.lock().expect("presenter rate lock").allow() {
            return false;
        }
        *self.latest.lock().expect("presenter lock") = Some(wire);
        true
    }

    pub fn latest(&self) -> Option<W> {
        self.latest.lock().expect("presenter lock").clone()
    }
}

//! What each published version changed, encoded once for every client
//! that follows the session: the running command's progress, the delta
//! from the version before, the events since it. A connection that saw
//! the versions before sends these as they are; only one that fell
//! further behind than the history works out its own.

use super::Wire;
use crate::session::wire;
use std::collections::VecDeque;
use std::sync::Arc;
use vramlab_shared::engine::Progress;
use vramlab_shared::protocol::session::update;
use vramlab_shared::snapshot::{Event, Snapshot};

/// Versions kept: a connection more than this many behind works out its
/// own update.
const HISTORY: usize = 16;

/// The last versions' updates, each following the one before.
#[derive(Debug, Default)]
pub struct Updates {
    ring: VecDeque<(u64, Arc<[Wire]>)>,
}

/// What changed from one published version to the next.
pub struct Change<'a> {
    pub old: &'a Snapshot,
    pub new: &'a Snapshot,
    /// The peaks (allocated, reserved) of the window that ended at it.
    pub peaks: (u64, u64),
    /// The events since the version before, and the first one's number.
    pub events: &'a [Event],
    pub first_event: u64,
    pub progress: Option<&'a (u64, Progress)>,
}

impl Change<'_> {
    /// The messages a client that saw the version before gets, encoded.
    pub fn encode(&self) -> Arc<[Wire]> {
        let progress = self.progress.map(|(id, p)| (*id, p));
        let (old, new) = (self.old, self.new);
        let messages = update(
            progress,
            (old, new),
            self.peaks,
            self.events.iter(),
            self.first_event,
        );
        messages.iter().map(wire).collect()
    }
}

impl Updates {
    /// Version `version`'s update (`None`: no one followed, so none was
    /// encoded, and the versions before no longer lead to the next).
    pub fn record(&mut self, version: u64, update: Option<Arc<[Wire]>>) {
        match update {
            Some(u) => {
                if self.ring.back().is_some_and(|&(v, _)| v + 1 != version) {
                    self.ring.clear();
                }
                self.ring.push_back((version, u));
                while self.ring.len() > HISTORY {
                    self.ring.pop_front();
                }
            }
            None => self.ring.clear(),
        }
    }

    /// The messages that take a client from version `seen` to `now`,
    /// when every version between is kept.
    pub fn since(&self, seen: u64, now: u64) -> Option<Vec<Wire>> {
        let first = self.ring.front()?.0;
        let last = self.ring.back()?.0;
        if first > seen + 1 || last != now || seen >= now {
            return None;
        }
        let from = (seen + 1 - first) as usize;
        Some(
            (self.ring.iter().skip(from))
                .flat_map(|(_, u)| u.iter().cloned())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(text: &str) -> Option<Arc<[Wire]>> {
        Some(vec![Wire::from(text)].into())
    }

    #[test]
    fn a_client_gets_every_version_it_missed_while_they_are_kept() {
        let mut u = Updates::default();
        for v in 1..=20 {
            u.record(v, update(&format!("v{v}")));
        }
        let texts = |w: Vec<Wire>| w.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert_eq!(texts(u.since(18, 20).unwrap()), ["v19", "v20"]);
        assert_eq!(texts(u.since(4, 20).unwrap()).len(), 16);
        // Older than the history, up to date, or ahead: none.
        assert!(u.since(3, 20).is_none());
        assert!(u.since(20, 20).is_none());
        assert!(u.since(18, 21).is_none());
        // A version no one followed breaks the chain.
        u.record(21, None);
        u.record(22, update("v22"));
        assert!(u.since(20, 22).is_none());
        assert_eq!(texts(u.since(21, 22).unwrap()), ["v22"]);
    }
}

//! A session moved from the page to the server: the lines the page's
//! engine ran are sent again, one at a time at the server's pace, with the
//! progress in the banner.

use super::App;
use leptos::prelude::*;
use std::collections::VecDeque;
use vramlab_shared::command::CommandLine;

impl App {
    /// On the server's hello: replays the lines a move brought, if any.
    pub(super) fn start_move(&self) -> bool {
        let left: VecDeque<CommandLine> = crate::playground::to_server::take().into();
        if left.is_empty() {
            return false;
        }
        let total = left.len();
        self.moving.set(crate::playground::to_server::Move {
            left,
            total,
            in_flight: None,
        });
        self.send_moved_line();
        true
    }

    fn send_moved_line(&self) {
        let Some(line) = self.moving.try_update(|m| m.left.pop_front()).flatten() else {
            return;
        };
        let id = self.submit_quietly(line);
        self.moving.update(|m| m.in_flight = id);
        self.words
            .banner
            .set(Some(self.moving.with_untracked(|m| m.words())));
        if id.is_none() {
            // A line that is not a command: nothing to wait for.
            self.after_moved_line();
        }
    }

    /// The next line after the server's pace allows (its commands a second).
    pub(super) fn after_moved_line(&self) {
        self.moving.update(|m| m.in_flight = None);
        self.words
            .banner
            .set(Some(self.moving.with_untracked(|m| m.words())));
        if self.moving.with_untracked(|m| m.left.is_empty()) {
            return;
        }
        let app = *self;
        let wait = self.play.min_ms.get_untracked();
        set_timeout(
            move || app.send_moved_line(),
            std::time::Duration::from_millis(wait),
        );
    }
}

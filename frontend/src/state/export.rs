//! The session written as a PyTorch memory snapshot (the server's answer
//! to `export_snapshot`): opened in the snapshot panel, or saved.

use super::App;
use crate::{files, socket};
use leptos::prelude::*;
use vramlab_shared::protocol::ClientMessage;
use vramlab_shared::torch_snapshot::{self, MemorySnapshot};

/// Where an exported session goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportTo {
    /// Opened in the snapshot panel.
    Panel,
    /// Saved as a pickle.
    Download,
}

impl App {
    /// Asks the server for this session as a memory snapshot.
    pub fn export(&self, to: ExportTo) {
        self.export_to.set(Some(to));
        socket::send(&ClientMessage::ExportSnapshot {});
    }

    pub(super) fn on_export(&self, snapshot: &MemorySnapshot) {
        let name = "vramlab-session.pickle";
        let bytes = torch_snapshot::write_pickle(snapshot);
        match self.export_to.get_untracked() {
            Some(ExportTo::Panel) => self.replays.open(name.into(), &bytes),
            Some(ExportTo::Download) => {
                if let Err(why) = files::download(name, &bytes, "application/octet-stream") {
                    self.words.banner.set(Some(why));
                }
            }
            None => {}
        }
        self.export_to.set(None);
    }
}

//! The session written as a PyTorch memory snapshot (the server's answer
//! to `export_snapshot`): opened in "Your snapshot" (a new tab), or saved.

use super::App;
use crate::files;
use crate::playground::socket;
use leptos::prelude::*;
use vramlab_shared::protocol::ClientMessage;
use vramlab_shared::torch_snapshot::{self, MemorySnapshot};

/// Where an exported session goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportTo {
    /// Opened in "Your snapshot" (snapshots/, a new tab).
    Page,
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
            Some(ExportTo::Page) => {
                if let Err(why) = open_in_snapshot_page(&bytes) {
                    self.words.banner.set(Some(why));
                }
            }
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

/// Opens snapshots/ in a new tab with `bytes` as this page's `blob:` URL in
/// its fragment (`#session=`): it reads them from there, nothing leaves the
/// browser. The click that asked is a moment ago, so the browser lets the
/// tab open; the URL is revoked a minute later.
fn open_in_snapshot_page(bytes: &[u8]) -> Result<(), String> {
    let url = files::blob_url(bytes, "application/octet-stream")?;
    let page = format!("./snapshots/#session={url}");
    let opened = web_sys::window().map(|w| w.open_with_url_and_target(&page, "_blank"));
    // The new tab reads the bytes as it opens; they are let go of after.
    leptos::prelude::set_timeout(
        move || _ = web_sys::Url::revoke_object_url(&url),
        std::time::Duration::from_secs(60),
    );
    match opened {
        Some(Ok(Some(_))) => Ok(()),
        _ => Err("The browser did not open a new tab for the snapshot: allow this page's pop-ups, or save the session as a snapshot and open the file in Your snapshot.".into()),
    }
}

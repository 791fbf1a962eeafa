//! Your snapshot: a PyTorch memory snapshot opened in the page, read in a
//! worker of its own ([`reading`]), replayed there ([`replays`]: exact,
//! what-if), compared and its fix searched ([`compare`]), and drawn
//! (`views`).

pub(crate) mod compare;
pub(crate) mod reading;
pub(crate) mod replays;
mod views;

pub use views::page::SnapshotPage;

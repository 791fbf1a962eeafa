//! Rebuilding the allocator's state at a recording's first event.
//!
//! The exact replay rebuilds it as recorded: every segment where it was,
//! cached blocks included. A what-if is a restart under other settings, so
//! the cache the run before the recording left is not its own: only what
//! was live at the start is allocated anew, where the allocator puts it.

use super::{Process, Replay};
use crate::initial::InitialState;
use crate::SnapshotError;
use vramlab_core::units::format_size;
use vramlab_device::alloc::AllocError;

/// The start does not fit the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StartRefused {
    /// Live when the recording starts (requested sizes).
    pub live_bytes: u64,
    pub why: String,
}

impl StartRefused {
    pub(crate) fn message(&self) -> String {
        format!(
            "the {} live when the recording starts do not fit: {}",
            format_size(self.live_bytes),
            self.why
        )
    }
}

impl InitialState {
    /// Bytes live at the start (requested sizes).
    pub fn live_bytes(&self) -> u64 {
        (self.segments.values())
            .flat_map(|s| s.blocks.values())
            .map(|&(_, requested)| requested)
            .sum()
    }
}

impl Replay<'_> {
    /// Rebuilds the state at the first event.
    pub(super) fn seed(&mut self, state: &InitialState) -> Result<(), SnapshotError> {
        match self.exact {
            true => self.seed_as_recorded(state)?,
            false => self
                .seed_live(state)
                .map_err(|r| SnapshotError::Replay(r.message()))?,
        }
        // Only the exact replay reads the allocator's trace.
        let a = self.process.allocator();
        a.drain_trace(&mut Vec::new());
        a.set_tracing(self.exact);
        a.reset_peak_stats();
        Ok(())
    }

    /// A what-if's start: the live blocks allocated anew.
    pub(super) fn seed_live(&mut self, state: &InitialState) -> Result<(), StartRefused> {
        for s in state.segments.values() {
            for (&address, &(_, requested)) in &s.blocks {
                match self
                    .process
                    .malloc_on(&mut self.device, requested, s.allocator_stream())
                {
                    Ok(Some(id)) => _ = self.blocks.insert(address, (id, None)),
                    Ok(None) => {}
                    Err(e) => {
                        let why = match e {
                            AllocError::OutOfMemory(_) => {
                                format!("no room for a live {} block", format_size(requested))
                            }
                            AllocError::Driver(why) => why,
                        };
                        return Err(StartRefused {
                            live_bytes: state.live_bytes(),
                            why,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The exact replay's start: every segment where the recording had it.
    fn seed_as_recorded(&mut self, state: &InitialState) -> Result<(), SnapshotError> {
        let refused = |why: String| {
            SnapshotError::Replay(format!(
                "the memory in use when the recording starts does not fit: {why}"
            ))
        };
        for s in state.segments.values() {
            match &mut self.process {
                Process::Caching(a) => {
                    self.device.place_next(s.address, s.size);
                    let at = a
                        .seed_segment(&mut self.device, s.size, (s.pool, s.allocator_stream()))
                        .map_err(|e| match e {
                            AllocError::Driver(why) => refused(why),
                            AllocError::OutOfMemory(_) => refused("out of memory".into()),
                        })?;
                    for (&address, &(size, requested)) in &s.blocks {
                        let id = a
                            .seed_block(at + (address - s.address), size, requested)
                            .map_err(|m| refused(m.0))?;
                        self.blocks.insert(address, (id, None));
                    }
                }
                #[cfg(not(feature = "mid-run-expandable"))]
                Process::Expandable(_) => {
                    return Err(SnapshotError::Replay(
                        "this recording with expandable segments starts mid-run: it replays under \"what if\" here (the exact replay of one that starts mid-run is the vramlab command line's and server's)".into(),
                    ))
                }
                #[cfg(feature = "mid-run-expandable")]
                Process::Expandable(a) => {
                    // Each stream's pool's range from its lowest mapped
                    // address.
                    let stream = s.allocator_stream();
                    let base = (state.segments.values())
                        .filter(|o| o.pool == s.pool && o.allocator_stream() == stream)
                        .map(|o| o.address)
                        .min()
                        .unwrap_or(s.address);
                    a.seed_range(&mut self.device, (s.pool, stream, base), s.address, s.size)
                        .map_err(|e| match e {
                            AllocError::Driver(why) => refused(why),
                            AllocError::OutOfMemory(_) => refused("out of memory".into()),
                        })?;
                    for (&address, &sizes) in &s.blocks {
                        let id = (a.seed_block((s.pool, stream), address, sizes))
                            .map_err(|m| refused(m.0))?;
                        self.blocks.insert(address, (id, None));
                    }
                }
                Process::Other(_) => {
                    return self.seed_live(state).map_err(|r| refused(r.why));
                }
            }
        }
        Ok(())
    }
}

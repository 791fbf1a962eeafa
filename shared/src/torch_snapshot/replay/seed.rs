//! Rebuilding the allocator's state at a recording's first event.

use super::{Process, Replay};
use crate::alloc::AllocError;
use crate::torch_snapshot::initial::InitialState;
use crate::torch_snapshot::SnapshotError;

impl Replay<'_> {
    /// Rebuilds the state at the first event.
    pub(super) fn seed(&mut self, state: &InitialState) -> Result<(), SnapshotError> {
        let refused = |why: String| {
            SnapshotError(format!(
                "the memory in use when the recording starts does not fit: {why}"
            ))
        };
        for s in state.segments.values() {
            match &mut self.process {
                Process::Caching(a) => {
                    self.device.place_next(s.address, s.size);
                    let at = a
                        .seed_segment(&mut self.device, s.size, (s.pool, s.stream))
                        .map_err(|e| match e {
                            AllocError::Driver(why) => refused(why),
                            AllocError::OutOfMemory(_) => refused("out of memory".into()),
                        })?;
                    for (&address, &(size, requested)) in &s.blocks {
                        let id = a
                            .seed_block(at + (address - s.address), size, requested)
                            .map_err(refused)?;
                        self.blocks.insert(address, (id, None));
                    }
                }
                #[cfg(not(feature = "mid-run-expandable"))]
                Process::Expandable(_) if self.exact => {
                    return Err(SnapshotError(
                        "this recording with expandable segments starts mid-run: it replays under \"what if\" here (the exact replay of one that starts mid-run is the vramlab command line's and server's)".into(),
                    ))
                }
                #[cfg(feature = "mid-run-expandable")]
                Process::Expandable(a) if self.exact => {
                    // Each pool's range from its lowest mapped address.
                    let base = (state.segments.values())
                        .filter(|o| o.pool == s.pool)
                        .map(|o| o.address)
                        .min()
                        .unwrap_or(s.address);
                    a.seed_range(&mut self.device, (s.pool, base), s.address, s.size)
                        .map_err(|e| match e {
                            AllocError::Driver(why) => refused(why),
                            AllocError::OutOfMemory(_) => refused("out of memory".into()),
                        })?;
                    for (&address, &sizes) in &s.blocks {
                        let id = a.seed_block(s.pool, address, sizes).map_err(refused)?;
                        self.blocks.insert(address, (id, None));
                    }
                }
                // Elsewhere the live blocks are allocated anew.
                _ => {
                    let a = self.process.allocator();
                    for (&address, &(_, requested)) in &s.blocks {
                        match a.malloc(&mut self.device, requested) {
                            Ok(Some(id)) => _ = self.blocks.insert(address, (id, None)),
                            Ok(None) => {}
                            Err(_) => {
                                return Err(refused(format!("a live {requested}-byte block")))
                            }
                        }
                    }
                }
            }
        }
        // Only the exact replay reads the allocator's trace.
        let a = self.process.allocator();
        a.drain_trace(&mut Vec::new());
        a.set_tracing(self.exact);
        a.reset_peak_stats();
        Ok(())
    }
}

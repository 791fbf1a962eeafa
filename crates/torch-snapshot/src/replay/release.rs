//! Memory a replay gives back other than by a freed block.
//!
//! **The program's `empty_cache()`.** A recording shows a release
//! (`segment_free`, or `segment_unmap` with expandable segments) either
//! inside a request that found no room (PyTorch's `malloc` releasing the
//! cache before it tries the driver once more, the request's own
//! `segment_alloc` or out-of-memory following at once) or where the
//! program released the cache (`torch.cuda.empty_cache()`, which
//! `torch.cuda.graph` calls before it captures). The first is the
//! allocator's to decide again in a what-if; the second is the program's,
//! and a what-if repeats it where the recording has it. They differ in their
//! stack: the retry's releases carry the request's own frames (`malloc`
//! gathers its context once), an `empty_cache()`'s their own (or, with
//! `context="alloc"`, those of the call that made the segment). A release
//! without a stack (older versions record none for the retry's) followed
//! by a new segment is read as a retry.
//!
//! **CUDA graphs' private pools** are kept until their graphs are gone:
//! PyTorch's `release_cached_blocks` frees a private pool only once it is
//! in `graph_pools_freeable`, which the trace does not record; a pool is
//! taken to be freeable from the run of releases that first gives back
//! memory of it (`PoolRoutes`).

use super::kernel::Process;
use super::Replay;
use crate::format::Action;

impl Replay<'_> {
    /// Tells the allocator which of its streams are private pools, each
    /// kept until the event from which it is freeable.
    pub(super) fn keeping_private_pools(mut self) -> Self {
        let mut freeable: Vec<(usize, u64)> = Vec::new();
        for (key, from) in self.routes.private_keys() {
            set_private_pool(&mut self.process, key, false);
            freeable.extend(from.map(|i| (i, key)));
        }
        freeable.sort_unstable();
        self.freeable = freeable.into();
        self
    }

    /// Before event `index`: the private pools freeable from there.
    pub(super) fn free_private_pools(&mut self, index: usize) {
        while let Some(&(from, key)) = self.freeable.front() {
            if from > index {
                break;
            }
            set_private_pool(&mut self.process, key, true);
            self.freeable.pop_front();
        }
    }

    /// A recorded release at event `index` in a what-if: at the first of
    /// a run of them, the program's `empty_cache()` is repeated there.
    pub(super) fn recorded_release(&mut self, index: usize) {
        if self.releases_end.is_some_and(|end| end > index) {
            return;
        }
        let trace = self.trace;
        let end = (index + 1..trace.len())
            .find(|&j| !is_release(trace.action(j)))
            .unwrap_or(trace.len());
        self.releases_end = Some(end);
        let retry = end < trace.len()
            && matches!(
                trace.action(end),
                Action::SegmentAlloc | Action::SegmentMap | Action::Oom
            )
            && (trace.frames(index).is_empty() || trace.frames(end) == trace.frames(index));
        if !retry {
            self.process.allocator().empty_cache(&mut self.device);
        }
    }
}

fn is_release(action: Action) -> bool {
    matches!(action, Action::SegmentFree | Action::SegmentUnmap)
}

fn set_private_pool(process: &mut Process, key: u64, freeable: bool) {
    match process {
        Process::Caching(a) => a.private_pools_mut().set(key, freeable),
        Process::Expandable(a) => a.private_pools_mut().set(key, freeable),
        Process::Other(_) => {}
    }
}

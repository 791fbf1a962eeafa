//! CUDA graphs' private pools as the caching allocator releases them
//! (`release_cached_blocks`, `graph_pools_freeable` and
//! `garbage_collect_cached_blocks` in `c10/cuda/CUDACachingAllocator.cpp`).
//!
//! A private pool's blocks are kept under a stream key of their own (see
//! `torch_snapshot::pools`). `empty_cache()` and the retry before an
//! out-of-memory free the default pools' whole free segments and those of
//! the private pools whose graphs are gone (freeable) only: a live graph
//! replays into its pool's memory, so none of it goes back. Garbage
//! collection frees the default large pool's alone.

use std::collections::BTreeMap;

/// The private pools an allocator holds, by their blocks' stream key.
#[derive(Clone, Debug, Default)]
pub struct PrivatePools {
    /// Stream key → whether the pool is freeable.
    freeable: BTreeMap<u64, bool>,
}

impl PrivatePools {
    /// Blocks kept under `stream` are a private pool's, freeable or not.
    pub fn set(&mut self, stream: u64, freeable: bool) {
        self.freeable.insert(stream, freeable);
    }

    /// Whether `release_cached_blocks` may free a whole free segment kept
    /// under `stream`.
    pub fn releasable(&self, stream: u64) -> bool {
        self.freeable.get(&stream).copied().unwrap_or(true)
    }

    /// Whether `stream`'s blocks are the default pools' (the only ones
    /// garbage collection looks at).
    pub fn is_default(&self, stream: u64) -> bool {
        !self.freeable.contains_key(&stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_private_pool_is_kept_until_freeable() {
        let mut pools = PrivatePools::default();
        assert!(pools.releasable(7) && pools.is_default(7));
        pools.set(7, false);
        assert!(!pools.releasable(7) && !pools.is_default(7));
        pools.set(7, true);
        assert!(pools.releasable(7), "its graphs are gone");
        assert!(!pools.is_default(7), "garbage collection never frees it");
        assert!(pools.releasable(0) && pools.is_default(0));
    }
}

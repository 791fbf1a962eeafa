//! One pool's expandable segment: an address range tiled by pieces
//! (unmapped, free, allocated), with indexes of the free and unmapped ones.

use crate::alloc::caching::{LARGE_BUFFER, SMALL_BUFFER};
use crate::alloc::{BlockId, PoolKind};
use crate::units::round_up;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Piece {
    Unmapped,
    Free,
    Allocated { id: BlockId, requested: u64 },
}

/// One pool's expandable segment: its address range tiled by pieces.
#[derive(Debug)]
pub(super) struct Space {
    pub(super) pool: PoolKind,
    pub(super) base: u64,
    pub(super) size: u64,
    pub(super) page: u64,
    /// Address → (size, piece); the pieces tile `[base, base + size)`.
    pub(super) pieces: BTreeMap<u64, (u64, Piece)>,
    /// Free pieces by (size, address).
    free: BTreeSet<(u64, u64)>,
    /// Unmapped pieces by address.
    unmapped: BTreeSet<u64>,
    /// Mapped pages by address, with the device memory behind each.
    pub(super) pages: BTreeMap<u64, u64>,
}

impl Space {
    pub(super) fn new(pool: PoolKind, base: u64, device_total: u64) -> Self {
        let page = if pool == PoolKind::Small {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        };
        let size = round_up(device_total + device_total / 8, page);
        Space {
            pool,
            base,
            size,
            page,
            pieces: BTreeMap::from([(base, (size, Piece::Unmapped))]),
            free: BTreeSet::new(),
            unmapped: BTreeSet::from([base]),
            pages: BTreeMap::new(),
        }
    }

    pub(super) fn piece(&self, address: u64) -> (u64, Piece) {
        self.pieces[&address]
    }

    pub(super) fn set(&mut self, address: u64, size: u64, piece: Piece) {
        if let Some(old) = self.pieces.insert(address, (size, piece)) {
            self.unindex(address, old);
        }
        match piece {
            Piece::Free => _ = self.free.insert((size, address)),
            Piece::Unmapped => _ = self.unmapped.insert(address),
            Piece::Allocated { .. } => {}
        }
    }

    fn remove(&mut self, address: u64) -> (u64, Piece) {
        let old = self.pieces.remove(&address).expect("a piece");
        self.unindex(address, old);
        old
    }

    fn unindex(&mut self, address: u64, (size, piece): (u64, Piece)) {
        match piece {
            Piece::Free => _ = self.free.remove(&(size, address)),
            Piece::Unmapped => _ = self.unmapped.remove(&address),
            Piece::Allocated { .. } => {}
        }
    }

    fn prev(&self, address: u64) -> Option<(u64, u64, Piece)> {
        let (&a, &(s, p)) = self.pieces.range(..address).next_back()?;
        Some((a, s, p))
    }

    fn next(&self, address: u64) -> Option<(u64, u64, Piece)> {
        let (&a, &(s, p)) = self.pieces.range(address + 1..).next()?;
        Some((a, s, p))
    }

    /// Merges the piece at `address` with neighbours in the same state
    /// (free with free, unmapped with unmapped); returns its address.
    pub(super) fn merge(&mut self, address: u64) -> u64 {
        let (mut start, (mut size, state)) = (address, self.piece(address));
        if matches!(state, Piece::Allocated { .. }) {
            return address;
        }
        if let Some((a, s, p)) = self.prev(start) {
            if p == state {
                self.remove(a);
                self.remove(start);
                (start, size) = (a, s + size);
                self.set(start, size, state);
            }
        }
        if let Some((a, s, p)) = self.next(start) {
            if p == state {
                self.remove(a);
                size += s;
                self.set(start, size, state);
            }
        }
        start
    }

    /// Splits the piece at `address` so that it is `size` long; the rest
    /// becomes a piece of `rest` state.
    pub(super) fn split(&mut self, address: u64, size: u64, rest: Piece) {
        let (whole, piece) = self.piece(address);
        if whole > size {
            self.set(address, size, piece);
            self.set(address + size, whole - size, rest);
        }
    }

    /// `get_free_block`: the smallest free block that fits, lowest address
    /// first; a later one whose size plus the unmapped space after it (its
    /// "expandable size") is smaller wins over it.
    pub(super) fn best_fit(&self, size: u64) -> Option<u64> {
        let expandable = |(s, a): (u64, u64)| match self.next(a) {
            Some((_, n, Piece::Unmapped)) => s + n,
            _ => s,
        };
        let mut candidates = self.free.range((size, 0)..).copied();
        let mut best = candidates.next()?;
        for next in candidates {
            if expandable(next) < expandable(best) {
                best = next;
            } else {
                break;
            }
        }
        Some(best.1)
    }

    /// `find_expandable_block`: the lowest unmapped piece (or the free piece
    /// just before it) from which free and unmapped space reach `size`.
    pub(super) fn expandable_candidate(&self, size: u64) -> Option<u64> {
        for &u in &self.unmapped {
            let start = match self.prev(u) {
                Some((a, _, Piece::Free)) => a,
                _ => u,
            };
            let mut room = 0;
            for (_, &(s, p)) in self.pieces.range(start..) {
                if matches!(p, Piece::Allocated { .. }) || room >= size {
                    break;
                }
                room += s;
            }
            if room >= size {
                return Some(start);
            }
        }
        None
    }
}

/// One space's tiling, merge and page invariants; returns (mapped bytes,
/// allocated bytes).
pub(super) fn check_space(space: &Space) -> Result<(u64, u64), String> {
    let (mut at, mut last, mut mapped, mut used) = (space.base, None, 0, 0);
    for (&address, &(size, piece)) in &space.pieces {
        if address != at || size == 0 {
            return Err(format!("pieces do not tile the range at {address:#x}"));
        }
        let same = |p: Piece| !matches!(p, Piece::Allocated { .. }) && Some(p) == last;
        if same(piece) {
            return Err(format!("two neighbouring pieces alike at {address:#x}"));
        }
        match piece {
            Piece::Unmapped => {}
            Piece::Free => mapped += size,
            Piece::Allocated { .. } => {
                mapped += size;
                used += size;
            }
        }
        last = Some(piece);
        at += size;
    }
    if at != space.base + space.size {
        return Err("pieces do not cover the range".into());
    }
    let pages = space.pages.len() as u64 * space.page;
    if pages != mapped {
        return Err(format!("{pages} bytes of pages back {mapped} mapped bytes"));
    }
    let free: BTreeSet<(u64, u64)> = space
        .pieces
        .iter()
        .filter(|(_, &(_, p))| p == Piece::Free)
        .map(|(&a, &(s, _))| (s, a))
        .collect();
    if free != space.free {
        return Err("the free index is out of date".into());
    }
    let unmapped: BTreeSet<u64> = space
        .pieces
        .iter()
        .filter(|(_, &(_, p))| p == Piece::Unmapped)
        .map(|(&a, _)| a)
        .collect();
    if unmapped != space.unmapped {
        return Err("the unmapped index is out of date".into());
    }
    Ok((mapped, used))
}

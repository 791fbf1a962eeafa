//! One pool's expandable segment: an address range tiled by pieces
//! (unmapped, free, allocated) in a doubly linked list, with indexes of the
//! free and unmapped ones. Pieces are named by their slot, so a live block
//! finds its piece without a search.

use crate::alloc::caching::{LARGE_BUFFER, SMALL_BUFFER};
use crate::alloc::{BlockId, PoolKind, Slab, NIL};
use std::collections::{BTreeMap, BTreeSet};
#[cfg(debug_assertions)]
use vramlab_core::error::Broken;
use vramlab_core::units::round_up;

/// A piece's slot in its space.
pub(super) type PieceId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Piece {
    Unmapped,
    Free,
    Allocated { id: BlockId, requested: u64 },
}

impl Piece {
    /// Free and unmapped neighbours merge; allocated ones never do.
    fn merges_with(self, other: Piece) -> bool {
        self == other && !matches!(self, Piece::Allocated { .. })
    }
}

/// One piece of the range, linked to its neighbours in address order.
#[derive(Clone, Copy, Debug)]
pub(super) struct Node {
    pub(super) address: u64,
    pub(super) size: u64,
    pub(super) piece: Piece,
    prev: PieceId,
    next: PieceId,
}

/// One pool's expandable segment on one stream: its address range tiled
/// by pieces.
#[derive(Debug)]
pub(super) struct Space {
    pub(super) stream: u64,
    pub(super) pool: PoolKind,
    pub(super) base: u64,
    pub(super) size: u64,
    pub(super) page: u64,
    nodes: Slab<Node>,
    head: PieceId,
    /// Free pieces by (size, address).
    free: BTreeSet<(u64, u64, PieceId)>,
    /// Unmapped pieces by address.
    unmapped: BTreeSet<(u64, PieceId)>,
    /// Mapped pages by address, with the device memory behind each.
    pub(super) pages: BTreeMap<u64, u64>,
}

impl Space {
    pub(super) fn new((stream, pool): (u64, PoolKind), base: u64, device_total: u64) -> Self {
        let page = if pool == PoolKind::Small {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        };
        let size = round_up(device_total + device_total / 8, page);
        let mut nodes = Slab::default();
        let head = nodes.insert(Node {
            address: base,
            size,
            piece: Piece::Unmapped,
            prev: NIL,
            next: NIL,
        });
        Space {
            stream,
            pool,
            base,
            size,
            page,
            nodes,
            head,
            free: BTreeSet::new(),
            unmapped: BTreeSet::from([(base, head)]),
            pages: BTreeMap::new(),
        }
    }

    #[inline]
    pub(super) fn node(&self, id: PieceId) -> &Node {
        self.nodes.get(id)
    }

    /// The piece after `id`, if any.
    pub(super) fn next(&self, id: PieceId) -> Option<PieceId> {
        Some(self.node(id).next).filter(|&n| n != NIL)
    }

    fn prev(&self, id: PieceId) -> Option<PieceId> {
        Some(self.node(id).prev).filter(|&p| p != NIL)
    }

    /// The pieces in address order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (PieceId, &Node)> + '_ {
        std::iter::successors(Some(self.head), |&id| self.next(id)).map(|id| (id, self.node(id)))
    }

    /// The free pieces, by size then address.
    pub(super) fn free_pieces(&self) -> Vec<PieceId> {
        self.free.iter().map(|&(_, _, id)| id).collect()
    }

    fn index(&mut self, id: PieceId) {
        let n = *self.node(id);
        match n.piece {
            Piece::Free => _ = self.free.insert((n.size, n.address, id)),
            Piece::Unmapped => _ = self.unmapped.insert((n.address, id)),
            Piece::Allocated { .. } => {}
        }
    }

    fn unindex(&mut self, id: PieceId) {
        let n = *self.node(id);
        match n.piece {
            Piece::Free => _ = self.free.remove(&(n.size, n.address, id)),
            Piece::Unmapped => _ = self.unmapped.remove(&(n.address, id)),
            Piece::Allocated { .. } => {}
        }
    }

    /// Gives the piece `id` a new state.
    pub(super) fn set(&mut self, id: PieceId, piece: Piece) {
        self.unindex(id);
        self.nodes.get_mut(id).piece = piece;
        self.index(id);
    }

    /// Splits the piece `id` so that it is `size` long; the rest becomes a
    /// piece of `rest` state just after it, whose slot is returned.
    pub(super) fn split(&mut self, id: PieceId, size: u64, rest: Piece) -> Option<PieceId> {
        let n = *self.node(id);
        if n.size <= size {
            return None;
        }
        self.unindex(id);
        let after = self.nodes.insert(Node {
            address: n.address + size,
            size: n.size - size,
            piece: rest,
            prev: id,
            next: n.next,
        });
        if n.next != NIL {
            self.nodes.get_mut(n.next).prev = after;
        }
        let node = self.nodes.get_mut(id);
        node.size = size;
        node.next = after;
        self.index(id);
        self.index(after);
        Some(after)
    }

    /// Joins the piece after `id` into it.
    fn absorb_next(&mut self, id: PieceId) {
        let next = self.node(id).next;
        self.unindex(id);
        self.unindex(next);
        let gone = self.nodes.remove(next);
        if gone.next != NIL {
            self.nodes.get_mut(gone.next).prev = id;
        }
        let node = self.nodes.get_mut(id);
        node.size += gone.size;
        node.next = gone.next;
        self.index(id);
    }

    /// Merges the piece `id` with neighbours in the same state (free with
    /// free, unmapped with unmapped); returns the merged piece.
    pub(super) fn merge(&mut self, id: PieceId) -> PieceId {
        let piece = self.node(id).piece;
        let mut at = id;
        if let Some(p) = self
            .prev(at)
            .filter(|&p| self.node(p).piece.merges_with(piece))
        {
            self.absorb_next(p);
            at = p;
        }
        if let Some(n) = self
            .next(at)
            .filter(|&n| self.node(n).piece.merges_with(piece))
        {
            debug_assert_ne!(n, at);
            self.absorb_next(at);
        }
        at
    }

    /// `get_free_block`: the smallest free block that fits, lowest address
    /// first; a later one whose size plus the unmapped space after it (its
    /// "expandable size") is smaller wins over it.
    pub(super) fn best_fit(&self, size: u64) -> Option<PieceId> {
        let expandable = |&(s, _, id): &(u64, u64, PieceId)| match self.next(id) {
            Some(n) if self.node(n).piece == Piece::Unmapped => s + self.node(n).size,
            _ => s,
        };
        let mut candidates = self.free.range((size, 0, 0)..);
        let mut best = candidates.next()?;
        for next in candidates {
            if expandable(next) < expandable(best) {
                best = next;
            } else {
                break;
            }
        }
        Some(best.2)
    }

    /// `find_expandable_block`: the lowest unmapped piece (or the free piece
    /// just before it) from which free and unmapped space reach `size`.
    pub(super) fn expandable_candidate(&self, size: u64) -> Option<PieceId> {
        self.unmapped.iter().find_map(|&(_, u)| {
            let start = match self.prev(u) {
                Some(p) if self.node(p).piece == Piece::Free => p,
                _ => u,
            };
            let room = self.room_from(start, size);
            (room >= size).then_some(start)
        })
    }

    /// Free and unmapped bytes from `start` up to the next allocated piece,
    /// counted until they reach `size`.
    fn room_from(&self, start: PieceId, size: u64) -> u64 {
        let (mut room, mut at) = (0, Some(start));
        while let Some(id) = at.filter(|_| room < size) {
            let n = self.node(id);
            if matches!(n.piece, Piece::Allocated { .. }) {
                break;
            }
            room += n.size;
            at = self.next(id);
        }
        room
    }
}

#[cfg(debug_assertions)]
/// One space's tiling, links, merge and page invariants; returns (mapped
/// bytes, allocated bytes).
pub(super) fn check_space(space: &Space) -> Result<(u64, u64), Broken> {
    let (mut at, mut last, mut mapped, mut used) = (space.base, None, 0, 0);
    let mut prev = NIL;
    let (mut free, mut unmapped) = (BTreeSet::new(), BTreeSet::new());
    for (id, n) in space.iter() {
        if n.address != at || n.size == 0 {
            return Err(Broken(format!(
                "pieces do not tile the range at {:#x}",
                n.address
            )));
        }
        if n.prev != prev {
            return Err(Broken(format!(
                "the piece at {:#x} has a wrong back link",
                n.address
            )));
        }
        if last.is_some_and(|l: Piece| l.merges_with(n.piece)) {
            return Err(Broken(format!(
                "two neighbouring pieces alike at {:#x}",
                n.address
            )));
        }
        match n.piece {
            Piece::Unmapped => _ = unmapped.insert((n.address, id)),
            Piece::Free => {
                free.insert((n.size, n.address, id));
                mapped += n.size;
            }
            Piece::Allocated { .. } => {
                mapped += n.size;
                used += n.size;
            }
        }
        (last, prev, at) = (Some(n.piece), id, at + n.size);
    }
    if at != space.base + space.size {
        return Err("pieces do not cover the range".into());
    }
    let pages = space.pages.len() as u64 * space.page;
    if pages != mapped {
        return Err(Broken(format!(
            "{pages} bytes of pages back {mapped} mapped bytes"
        )));
    }
    if free != space.free {
        return Err("the free index is out of date".into());
    }
    if unmapped != space.unmapped {
        return Err("the unmapped index is out of date".into());
    }
    Ok((mapped, used))
}

//! Rebuilding a recording's mapped ranges and live blocks when it starts
//! mid-run, before replaying what happened after it.

use super::space::Piece;
use super::ExpandableAllocator;
use crate::alloc::{AllocError, BlockId, Mismatch, PoolKind};
use crate::device::Device;

impl ExpandableAllocator {
    /// A recording that starts mid-run: `size` bytes of the range of
    /// `pool` on `stream` mapped at `address`, nothing in them yet. The
    /// range starts at `base` (where the recording's did is not recorded:
    /// the lowest mapped address of that pool on that stream), made at the
    /// first call.
    pub fn seed_range(
        &mut self,
        device: &mut dyn Device,
        (pool, stream, base): (PoolKind, u64, u64),
        address: u64,
        size: u64,
    ) -> Result<(), AllocError> {
        let refused_base = || AllocError::Driver(format!("a range at {base:#x} does not fit"));
        if self.find(stream, pool).is_none() {
            if !self.fits(base) {
                return Err(refused_base());
            }
            self.next_base = base;
        }
        let i = self.space(stream, pool);
        let space = &mut self.spaces[i];
        let refused =
            |why: &str| AllocError::Driver(format!("{size} bytes at {address:#x}: {why}"));
        let inside = space.iter().find(|(_, n)| {
            n.piece == Piece::Unmapped
                && n.address <= address
                && address + size <= n.address + n.size
        });
        let Some((at, node)) = inside.map(|(at, n)| (at, *n)) else {
            return Err(refused("not unmapped space of its pool's range"));
        };
        if size % space.page != 0 || (address - space.base) % space.page != 0 {
            return Err(refused("not whole pages of its pool's range"));
        }
        let at = match address > node.address {
            true => space.split(at, address - node.address, Piece::Unmapped),
            false => Some(at),
        };
        let at = at.ok_or_else(|| refused("no room"))?;
        match self.map(device, i, at, size)? {
            Some(_) => Ok(()),
            None => Err(self.out_of_memory(device, size, size)),
        }
    }

    /// A live block of exactly `size` bytes at `address`, inside free
    /// mapped space of the range of `pool` on `stream` (a recording that
    /// starts mid-run).
    pub fn seed_block(
        &mut self,
        (pool, stream): (PoolKind, u64),
        address: u64,
        (size, requested): (u64, u64),
    ) -> Result<BlockId, Mismatch> {
        let i = self
            .find(stream, pool)
            .ok_or_else(|| Mismatch("no mapped range in its pool".into()))?;
        let space = &mut self.spaces[i];
        let inside = space.iter().find(|(_, n)| {
            n.piece == Piece::Free && n.address <= address && address + size <= n.address + n.size
        });
        let (at, node) = inside.map(|(at, n)| (at, *n)).ok_or_else(|| {
            Mismatch(format!(
                "no free mapped space for {size} bytes at {address:#x}"
            ))
        })?;
        let at = match address > node.address {
            true => space
                .split(at, address - node.address, Piece::Free)
                .ok_or_else(|| Mismatch("no room".into()))?,
            false => at,
        };
        space.split(at, size, Piece::Free);
        let id = self.blocks.insert((i, at));
        self.spaces[i].set(at, Piece::Allocated { id, requested });
        self.count_allocated(size, requested);
        Ok(id)
    }
}

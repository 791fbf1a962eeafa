//! XLA's buffer assignment of an executable's values, as
//! `xla/service/buffer_assignment.cc` makes it for the entry computation:
//! each value a live range on the executable's sequential schedule; output
//! buffers first, one allocation each; then, largest value first, a value
//! shares an output allocation that is big enough and whose contents do
//! not overlap it in time (`BufferAssigner::MaybeAssignBuffer`); what is
//! left is packed into the one temp allocation by
//! `GlobalDecreasingSizeBestFitHeap` (largest first, each into the
//! smallest gap that fits among the values live at the same time, or past
//! them all), every offset aligned.

/// A value of the executable: `bytes` live from its defining instruction
/// `start` to its last use `end` (inclusive, in schedule positions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Value {
    pub bytes: u64,
    pub start: u32,
    pub end: u32,
}

impl Value {
    fn overlaps(&self, other: &Value) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

/// An output buffer: its bytes, and when its value is written (it lives
/// from then to the end). A donated output is its argument's buffer,
/// which is live from the start: it shares nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Output {
    pub bytes: u64,
    pub written: u32,
    pub donated: bool,
}

/// The temp allocation's size in bytes for `values`, given the outputs
/// they may share, offsets aligned to `alignment`.
pub fn temp_bytes(values: &[Value], outputs: &[Output], alignment: u64) -> u64 {
    // Largest first; among equals, the earlier listed.
    let mut order: Vec<(u64, usize)> = (values.iter())
        .map(|v| u64::MAX - v.bytes)
        .zip(0..)
        .collect();
    order.sort_unstable();
    let mut hosts: Vec<Vec<Value>> = outputs
        .iter()
        .map(|o| {
            let end = u32::MAX;
            let lives = if o.donated { 0 } else { o.written };
            vec![Value {
                bytes: o.bytes,
                start: lives,
                end,
            }]
        })
        .collect();
    let mut heap = Heap::new(alignment);
    for (_, i) in order {
        let v = values[i];
        let host = outputs
            .iter()
            .zip(&hosts)
            .position(|(o, within)| o.bytes >= v.bytes && within.iter().all(|w| !w.overlaps(&v)));
        match host {
            Some(h) => hosts[h].push(v),
            None => heap.place(v),
        }
    }
    heap.size
}

/// `GlobalDecreasingSizeBestFitHeap`: values placed in the order given
/// (largest first), each at the best-fitting free offset among the values
/// already placed that live at the same time.
struct Heap {
    alignment: u64,
    placed: Vec<(Value, u64)>,
    size: u64,
}

impl Heap {
    fn new(alignment: u64) -> Self {
        Heap {
            alignment: alignment.max(1),
            placed: Vec::new(),
            size: 0,
        }
    }

    fn place(&mut self, v: Value) {
        let aligned = |p: &Value| p.bytes.div_ceil(self.alignment) * self.alignment;
        // The values placed that live at the same time, by offset.
        let mut taken: Vec<(u64, usize)> = (self.placed.iter().enumerate())
            .filter(|(_, (p, _))| p.overlaps(&v))
            .map(|(i, &(_, offset))| (offset, i))
            .collect();
        taken.sort_unstable();
        let bytes = aligned(&v);
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        let mut cursor = 0;
        for &(start, i) in &taken {
            if start > cursor {
                let gap = start - cursor;
                if gap >= bytes && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(start + aligned(&self.placed[i].0));
        }
        let offset = best.map_or(cursor, |(_, offset)| offset);
        self.placed.push((v, offset));
        self.size = self.size.max(offset + bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(bytes: u64, start: u32, end: u32) -> Value {
        Value { bytes, start, end }
    }

    #[test]
    fn values_apart_in_time_share_offsets_and_together_add_up() {
        assert_eq!(temp_bytes(&[v(100, 0, 1), v(100, 2, 3)], &[], 1), 100);
        assert_eq!(temp_bytes(&[v(100, 0, 2), v(50, 2, 3)], &[], 1), 150);
        assert_eq!(temp_bytes(&[v(100, 0, 2), v(50, 2, 3)], &[], 64), 192);
    }

    #[test]
    fn a_smaller_value_takes_the_smallest_gap_that_fits() {
        // 300 and 100 live early; 200 late overlaps only the 300's end.
        let values = [v(300, 0, 4), v(200, 4, 9), v(100, 0, 9), v(150, 5, 9)];
        // 300 at 0; 200 at 300 (overlaps 300); 150 at 0 (300 is dead by
        // then, gap 0..300 is the only one); 100 past the 300 and the
        // 200 at 500.
        assert_eq!(temp_bytes(&values, &[], 1), 600);
    }

    #[test]
    fn an_output_not_yet_written_hosts_what_dies_before_it() {
        let outputs = [Output {
            bytes: 100,
            written: 5,
            donated: false,
        }];
        assert_eq!(temp_bytes(&[v(80, 0, 4)], &outputs, 1), 0);
        // Alive when the output is written: it cannot share.
        assert_eq!(temp_bytes(&[v(80, 0, 5)], &outputs, 1), 80);
        // A donated output is its argument, live from the start.
        let donated = [Output {
            donated: true,
            ..outputs[0]
        }];
        assert_eq!(temp_bytes(&[v(80, 0, 4)], &donated, 1), 80);
        // Too big to fit.
        assert_eq!(temp_bytes(&[v(120, 0, 4)], &outputs, 1), 120);
    }
}

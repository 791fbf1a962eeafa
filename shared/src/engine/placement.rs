//! Where the memory play put a step's tensors on the device: each
//! allocation's block, the parameters', the batch's, each BLAS call's
//! workspace. A device that holds values computes on them
//! (`engine::on_device`). The page's engine runs on a simulated GPU only:
//! built without the `device-values` feature, it records nothing and a
//! placement is empty.

#[cfg(feature = "device-values")]
pub(super) use recorded::Placement;

#[cfg(not(feature = "device-values"))]
pub(super) use empty::Placement;

#[cfg(feature = "device-values")]
mod recorded {
    use crate::engine::Engine;
    use crate::process::Process;
    use crate::runtime::ObjId;
    use crate::train::ModelSpec;

    #[derive(Clone, Debug, Default, PartialEq)]
    pub struct Placement {
        /// Each allocation's block address, once made (none for an empty
        /// tensor).
        pub allocs: Vec<Option<u64>>,
        /// Each parameter's, in `parameters()` order.
        pub params: Vec<Option<u64>>,
        /// The batch's inputs and targets.
        pub batch: [Option<u64>; 2],
        /// Each BLAS call's workspace, by the op's position: its address
        /// and size.
        pub workspaces: Vec<(usize, u64, u64)>,
    }

    /// Nothing is recorded unless the device holds values (a simulated
    /// GPU does not: recording would only slow its steps).
    impl Placement {
        /// Nothing placed yet.
        pub fn new() -> Self {
            Self::default()
        }

        /// A play of a program of `allocs` allocations with `params` begins.
        pub fn begin(&mut self, k: &Process, allocs: usize, params: &[ObjId]) {
            if !k.device.holds_values() {
                return;
            }
            self.allocs.resize(allocs, None);
            self.params = params.iter().map(|&p| k.address(p)).collect();
        }

        /// Allocation `i` is tensor `id`.
        pub fn place(&mut self, i: usize, k: &Process, id: ObjId) {
            if let Some(slot) = self.allocs.get_mut(i) {
                *slot = k.address(id);
            }
        }

        /// The batch [`Engine::next_batch`] draws next: `held`'s tensors
        /// (the loop's `x` and `y`, a statement's), or its rows of a
        /// dataset on the device.
        pub fn place_batch(
            &mut self,
            e: &Engine,
            (data, spec): (ObjId, &ModelSpec),
            held: impl FnOnce() -> [Option<ObjId>; 2],
        ) {
            let k = &e.process;
            if !k.device.holds_values() {
                return;
            }
            let Some(d) = e.train.datasets.get(&data) else {
                return;
            };
            let Some((x, y)) = d.on_device else {
                self.batch = held().map(|id| id.and_then(|id| k.address(id)));
                return;
            };
            let (x_shape, x_dtype, y_shape) = spec.batch(1);
            let row = |shape: Vec<u64>, bytes: u64| shape.iter().product::<u64>() * bytes;
            let rows = [row(x_shape, x_dtype.size_bytes()), row(y_shape, 8)];
            self.batch =
                [(x, rows[0]), (y, rows[1])].map(|(id, row)| Some(k.address(id)? + d.cursor * row));
        }

        pub fn batch(&self) -> [Option<u64>; 2] {
            self.batch
        }

        /// The BLAS call at op `position` computes in `workspace`.
        pub fn place_workspace(&mut self, position: usize, workspace: Option<(u64, u64)>) {
            if let Some((at, bytes)) = workspace {
                self.workspaces.push((position, at, bytes));
            }
        }
    }
}

#[cfg(not(feature = "device-values"))]
mod empty {
    use crate::engine::Engine;
    use crate::process::Process;
    use crate::runtime::ObjId;
    use crate::train::ModelSpec;

    /// Nothing: no device here holds values.
    #[derive(Clone, Debug, Default, PartialEq)]
    pub struct Placement;

    impl Placement {
        pub fn new() -> Self {
            Placement
        }
        pub fn begin(&mut self, _: &Process, _: usize, _: &[ObjId]) {}
        pub fn place(&mut self, _: usize, _: &Process, _: ObjId) {}
        pub fn place_batch(
            &mut self,
            _: &Engine,
            _: (ObjId, &ModelSpec),
            _: impl FnOnce() -> [Option<ObjId>; 2],
        ) {
        }
        pub fn place_workspace(&mut self, _: usize, _: Option<(u64, u64)>) {}
    }
}

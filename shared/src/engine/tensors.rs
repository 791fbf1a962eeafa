//! Tensors and references: `alloc`, `del`, `hold`, `gc.collect()`,
//! `empty_cache()` and `clear_session()`.

use super::{check_name, error, name_error, Engine, Outcome};
use crate::command::{AllocArgs, AppendArgs, AssignArgs, HoldArgs};
use crate::error::{CommandError, ErrorKind};
use crate::runtime::{Holder, ObjId};
use crate::train::cublas::clear_cublas_workspaces;
use crate::types::{Category, Dtype, Framework};
use crate::units::{format_size, EIB};

/// The most objects (tensors, lists, models…) a session's kernel holds.
pub const MAX_OBJECTS: usize = 50_000;

impl Engine {
    pub(super) fn alloc(&mut self, a: &AllocArgs) -> Result<Outcome, CommandError> {
        let name = a.name.as_str();
        check_name(name)?;
        self.room_for_an_object()?;
        let category = a.category.unwrap_or_default();
        let (bytes, shape, dtype) = alloc_size(a)?;
        if bytes >= EIB {
            return Err(self.more_than_an_exabyte(bytes));
        }
        let id = if self.settings.framework == Framework::Jax {
            self.jnp_zeros(name, bytes, shape, dtype, category)?
        } else {
            self.process
                .alloc_tensor(name, bytes, shape, dtype, category)
                .map_err(|f| self.op_alloc_error(&f, Some("Fill")))?
        };
        let block_size = self.process.block_size(id);
        let had_old = self.process.runtime.lookup(name).is_some();
        let freed = self.process.bind_local(name, id);
        let mut note = format!(
            "`{name}` holds a block of {} ({} asked).",
            format_size(block_size),
            format_size(bytes)
        );
        if had_old && freed > 0 {
            note.push_str(&format!(
                " Rebinding `{name}` dropped the old object's last reference: {} freed, after the new block was taken.",
                format_size(freed)
            ));
        }
        Ok(Outcome::note(note))
    }

    /// `jnp.zeros(shape, dtype)` as JAX runs it (`lax.full`): the Python
    /// `0` is put on the device (a weakly typed int32 scalar), converted to
    /// `dtype` (a second scalar), the first one dropped; the second is then
    /// broadcast into the output and dropped. Three allocations, the
    /// scalars of XLA's 256-byte minimum: measured on an H100 with JAX 0.11
    /// (`num_allocs` grows by 3, `peak_bytes_in_use` ends 256 bytes over
    /// `bytes_in_use`), and where the output lands follows from them.
    fn jnp_zeros(
        &mut self,
        name: &str,
        bytes: u64,
        shape: Vec<u64>,
        dtype: Dtype,
        category: Category,
    ) -> Result<ObjId, CommandError> {
        let scalar = |engine: &mut Self, what: &str, dtype: Dtype| {
            engine
                .process
                .alloc_tensor(what, dtype.size_bytes(), vec![], dtype, Category::Temporary)
                .map_err(|f| engine.op_alloc_error(&f, Some("Fill")))
        };
        let fill = scalar(self, "jnp.zeros: the fill value 0 (int32)", Dtype::Int32)?;
        let converted = scalar(self, "jnp.zeros: the fill value as the dtype", dtype);
        self.process.drop_local(fill);
        let converted = converted?;
        let out = self
            .process
            .alloc_tensor(name, bytes, shape, dtype, category)
            .map_err(|f| self.op_alloc_error(&f, Some("Fill")));
        self.process.drop_local(converted);
        out
    }

    /// PyTorch refuses any request of 1 EiB or more before its allocator
    /// sees it (`allocate`: "Tried to allocate more than 1EB memory").
    fn more_than_an_exabyte(&self, bytes: u64) -> CommandError {
        match self.settings.framework {
            Framework::Pytorch => error(
                ErrorKind::OutOfMemory,
                "CUDA out of memory. Tried to allocate more than 1EB memory.",
            ),
            _ => error(
                ErrorKind::InvalidValue,
                format!("{bytes} bytes is absurd: no GPU has 1 EiB"),
            ),
        }
    }

    pub(super) fn lookup(&self, name: &str) -> Result<ObjId, CommandError> {
        self.process
            .runtime
            .lookup(name)
            .ok_or_else(|| name_error(name))
    }

    pub(super) fn del(&mut self, name: &str) -> Result<Outcome, CommandError> {
        let id = self.lookup(name)?;
        let children = self
            .process
            .runtime
            .get(id)
            .map(|o| o.refs.clone())
            .unwrap_or_default();
        let released = self
            .process
            .runtime
            .unbind(name)
            .ok_or_else(|| name_error(name))?;
        let freed = self.process.release(&released);
        #[cfg(feature = "hf-models")]
        if let Some(&held) = self.hf.llms.get(&id).filter(|_| !released.is_empty()) {
            return Ok(Outcome::note(format!(
                "`{name}` was the last reference to vLLM's `LLM`: its client's finalizer shut the engine core down, and its process's exit gave {} back to the driver (nvidia-smi fell; this process's allocator never held any of it).",
                format_size(held)
            )));
        }
        let note = if released.is_empty() {
            // Who holds it, looked for only when someone does (a walk over
            // every object: a `del` that frees stays cheap however many live).
            let holders = self.process.runtime.holders_of(id, Some(name));
            format!(
                "`del {name}` removed the name only: the object is still referenced (by {}), so nothing was freed.",
                holders.join(", ")
            )
        } else if freed == 0 {
            // The object died; what it referred to may live on elsewhere.
            let survivor = children
                .iter()
                .find(|&&c| self.process.runtime.get(c).is_some() && c != id);
            match survivor {
                Some(&c) => format!(
                    "`{name}` died, but no memory was freed: what it held is still referenced (by {}).",
                    self.process.runtime.holders_of(c, None).join(", ")
                ),
                None => format!("`{name}` was the last reference: the object died, but it held no device memory."),
            }
        } else {
            format!(
                "`{name}` was the last reference: {} went back to the allocator's cache (allocated fell; reserved did not).",
                format_size(freed)
            )
        };
        Ok(Outcome::note(note))
    }

    /// `y = x`: binds `name` to the object `value` names.
    pub(super) fn assign(&mut self, a: &AssignArgs) -> Result<Outcome, CommandError> {
        let (name, value) = (a.name.as_str(), a.value.as_str());
        check_name(name)?;
        let id = self.lookup(value)?;
        if name == value {
            return Ok(Outcome::note(format!("`{name} = {name}` changes nothing.")));
        }
        let released = self.process.runtime.bind(name, id);
        let freed = self.process.release(&released);
        let refs = self.process.runtime.get(id).map_or(0, |o| o.refcount);
        let mut note = format!(
            "`{name}` and `{value}` now name one object ({refs} references): nothing was allocated, and `del` of either frees nothing while the other lives."
        );
        if freed > 0 {
            note.push_str(&format!(
                " Rebinding `{name}` dropped its old object's last reference: {} freed.",
                format_size(freed)
            ));
        }
        Ok(Outcome::note(note))
    }

    /// `h.append(x)`: the list takes one more reference.
    pub(super) fn append(&mut self, a: &AppendArgs) -> Result<Outcome, CommandError> {
        let (name, item) = (a.name.as_str(), a.item.as_str());
        let list = self.lookup(name)?;
        let kind = self
            .process
            .runtime
            .get(list)
            .map(|o| o.kind.type_name())
            .unwrap_or_default();
        if kind != "list" {
            return Err(error(
                ErrorKind::InvalidValue,
                format!("AttributeError: '{kind}' object has no attribute 'append' (`{name}` is not a list)"),
            ));
        }
        let target = self.lookup(item)?;
        self.process.runtime.add_ref(list, target);
        Ok(Outcome::note(if list == target {
            format!("`{name}` now holds itself: a reference cycle. `del {name}` will leave it alive until gc.collect() finds it.")
        } else {
            format!("`{name}` holds `{item}` too: `del {item}` alone will not free it.")
        }))
    }

    /// Refuses a new object once the process holds [`MAX_OBJECTS`]: what
    /// every command costs grows with them (the snapshot a page draws).
    fn room_for_an_object(&self) -> Result<(), CommandError> {
        let live = self.process.runtime.objects().len();
        match live < MAX_OBJECTS {
            true => Ok(()),
            false => Err(error(
                ErrorKind::InvalidValue,
                format!("this kernel holds {live} objects, the most vramlab keeps in one session: `del` some first (a real PyTorch process would hold them, but each would be a line on this page)"),
            )),
        }
    }

    pub(super) fn hold(&mut self, a: &HoldArgs) -> Result<Outcome, CommandError> {
        let (name, items, cycle) = (a.name.as_str(), &a.items, a.cycle);
        check_name(name)?;
        self.room_for_an_object()?;
        let ids = items
            .iter()
            .map(|item| self.lookup(item))
            .collect::<Result<Vec<ObjId>, _>>()?;
        let list = self.process.runtime.new_list(&ids, cycle, name);
        self.process.bind_local(name, list);
        let mut note = format!("`{name}` is a list holding {} reference(s)", ids.len());
        if cycle {
            note.push_str(" and itself: a reference cycle that only gc.collect() can break");
        }
        note.push('.');
        Ok(Outcome::note(note))
    }

    pub(super) fn gc(&mut self) -> Outcome {
        let (found, released) = self.process.runtime.collect();
        let freed = self.process.release(&released);
        Outcome::note(if found == 0 {
            "gc.collect() found no unreachable objects: every live tensor is still referenced, so nothing was freed.".to_string()
        } else {
            format!(
                "gc.collect() found {found} unreachable object(s) kept alive only by reference cycles and freed {}.",
                format_size(freed)
            )
        })
    }

    pub(super) fn empty_cache(&mut self) -> Outcome {
        let released = self
            .process
            .allocator
            .empty_cache(self.process.device.as_mut());
        self.process.drain_allocator_events();
        Outcome::note(match released {
            Some(0) if self.settings.no_caching => {
                "With caching off there is no cache: every tensor already went back to the driver when it died.".to_string()
            }
            Some(0) => {
                "empty_cache() released nothing: no segment was entirely free. Live tensors keep their blocks, and free pieces of partly used segments cannot be returned.".to_string()
            }
            Some(bytes) => format!(
                "empty_cache() returned {} of entirely free segments to the driver: reserved and nvidia-smi fell; allocated did not move.",
                format_size(bytes)
            ),
            None => format!(
                "{} has no empty_cache(): its BFC pool keeps every byte until the process exits. Nothing changed.",
                self.settings.framework.display_name()
            ),
        })
    }

    /// `torch._C._cuda_clearCublasWorkspaces()`: the workspaces go back to
    /// the allocator's cache (not to the driver).
    pub(super) fn clear_cublas_workspaces(&mut self) -> Outcome {
        if self.settings.framework != Framework::Pytorch {
            return Outcome::note(format!(
                "{} allocates no cuBLAS workspace through its allocator: nothing to clear.",
                self.settings.framework.display_name()
            ));
        }
        let per_call = self.train.cublas.config.per_call;
        let freed = clear_cublas_workspaces(&mut self.process, &mut self.train);
        Outcome::note(if per_call {
            "PyTorch 2.15 keeps no cuBLAS workspace: each matrix product frees its own as it returns (TORCH_CUBLAS_WORKSPACE_CACHE=1 keeps one per thread).".to_string()
        } else if freed == 0 {
            "No cuBLAS workspace exists yet: a thread makes one at its first matrix product."
                .to_string()
        } else {
            format!(
                "The cuBLAS workspaces ({}) went back to the cache: allocated fell, reserved and nvidia-smi did not (empty_cache() can return them now). The next matrix product on each thread allocates its workspace again.",
                format_size(freed)
            )
        })
    }

    pub(super) fn clear_session(&mut self) -> Outcome {
        let dropped = self.process.runtime.release_holder(Holder::FrameworkState);
        let mut freed = self.process.release(&dropped);
        let (found, collected) = self.process.runtime.collect();
        freed += self.process.release(&collected);
        Outcome::note(format!(
            "clear_session() dropped the framework's global state and ran gc.collect() ({found} unreachable object(s)): {} freed inside the pool. The pool itself and nvidia-smi did not shrink.",
            format_size(freed)
        ))
    }
}

/// The bytes, shape and dtype an `alloc` asks for: `bytes` alone (uint8),
/// or `shape` with `dtype` (float32 by default).
fn alloc_size(a: &AllocArgs) -> Result<(u64, Vec<u64>, Dtype), CommandError> {
    let invalid = |m: String| error(ErrorKind::InvalidValue, m);
    let (bytes, shape, dtype) = match (a.bytes, a.shape.as_deref(), a.dtype) {
        (Some(b), None, None) => (b, vec![b], Dtype::Uint8),
        (None, Some(shape), dtype) => {
            let dtype = dtype.unwrap_or(Dtype::Float32);
            let total = shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .and_then(|n| n.checked_mul(dtype.size_bytes()));
            match total {
                Some(b) => (b, shape.to_vec(), dtype),
                None => {
                    return Err(invalid(format!(
                        "shape {shape:?} of {} has more bytes than a 64-bit size can hold",
                        dtype.torch_name()
                    )))
                }
            }
        }
        (Some(_), Some(_), _) => {
            return Err(error(
                ErrorKind::InvalidCommand,
                "give either `bytes` or `shape` (with `dtype`), not both",
            ))
        }
        (Some(_), None, Some(_)) => {
            return Err(error(
                ErrorKind::InvalidCommand,
                "`dtype` goes with `shape`; `bytes` alone allocates uint8",
            ))
        }
        (None, None, _) => {
            return Err(error(
                ErrorKind::InvalidCommand,
                "alloc needs `bytes`, or `shape` and `dtype`",
            ))
        }
    };
    Ok((bytes, shape, dtype))
}

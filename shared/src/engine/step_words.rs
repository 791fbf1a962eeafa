//! What a step's statements did, in the words of the framework the kernel
//! runs: PyTorch's autograd graph and `.grad`, TensorFlow's GradientTape
//! and the gradients `tape.gradient` returns, JAX's `jax.vjp` residuals.

use crate::types::Framework;
use crate::units::format_size;

/// After a forward pass that keeps `saved` bytes for the backward pass
/// (`grad`), or one that keeps nothing.
pub(super) fn forward(framework: Framework, name: &str, grad: bool, saved: u64) -> String {
    let saved = format_size(saved);
    match (framework, grad) {
        (Framework::Pytorch, true) => format!(
            "`{name}` keeps its autograd graph alive, and with it {saved} of saved tensors (activations and the batch) until backward runs or `{name}` dies."
        ),
        (Framework::Tensorflow, true) => format!(
            "The GradientTape that recorded `{name}` keeps {saved} of saved tensors (activations and the batch) until tape.gradient runs or the tape dies."
        ),
        (Framework::Jax, true) => format!(
            "`{name}`'s vjp function keeps {saved} of residuals (activations and the batch) until it runs or dies."
        ),
        (Framework::Pytorch, false) => "Under torch.no_grad() nothing is saved: every activation died as soon as the next layer had used it.".into(),
        (Framework::Tensorflow, false) => "With no GradientTape recording nothing is saved: every activation died as soon as the next layer had used it.".into(),
        (Framework::Jax, false) => "Outside jax.vjp and jax.grad nothing is saved: every activation died as soon as the next layer had used it.".into(),
    }
}

/// After the backward pass, which moved allocated from `before` to `after`.
pub(super) fn backward(framework: Framework, retain: bool, before: u64, after: u64) -> String {
    let moved = format!(
        "allocated {} {}",
        if after >= before {
            "rose by"
        } else {
            "fell by"
        },
        format_size(after.abs_diff(before))
    );
    match (framework, retain) {
        (Framework::Pytorch, true) => "Backward ran with retain_graph=True: the gradients were added to .grad and the saved tensors stay for another backward.".into(),
        (Framework::Pytorch, false) => format!(
            "Backward released the saved tensors as it walked the graph and put the gradients in .grad ({moved})."
        ),
        (Framework::Tensorflow, true) => format!(
            "tape.gradient of a persistent tape returned the gradients; the saved tensors stay until the tape dies ({moved})."
        ),
        (Framework::Tensorflow, false) => format!(
            "tape.gradient released the saved tensors as it walked the tape and returned the gradients, new tensors that live as long as Python keeps them ({moved})."
        ),
        (Framework::Jax, _) => format!(
            "The vjp function released its residuals and returned the gradients, new arrays that live as long as Python keeps them ({moved})."
        ),
    }
}

/// After the gradients were dropped (`set_to_none`, `freed` bytes) or zeroed.
pub(super) fn zero_grad(framework: Framework, set_to_none: bool, freed: u64) -> String {
    match (framework, set_to_none) {
        (Framework::Pytorch, true) => format!(
            "zero_grad(set_to_none=True) dropped every .grad: {} freed.",
            format_size(freed)
        ),
        (Framework::Pytorch, false) => "zero_grad(set_to_none=False) zeroed the gradients in place: their memory stays allocated.".into(),
        (_, true) => format!(
            "`del grads`: the last reference to the gradients went, so they died: {} freed.",
            format_size(freed)
        ),
        (_, false) => "The gradients were zeroed and kept: their memory stays allocated.".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_framework_names_what_keeps_the_saved_tensors() {
        assert_eq!(
            forward(Framework::Tensorflow, "loss", true, 2048),
            "The GradientTape that recorded `loss` keeps 2.00 KiB of saved tensors (activations and the batch) until tape.gradient runs or the tape dies."
        );
        assert!(forward(Framework::Jax, "loss", true, 0)
            .starts_with("`loss`'s vjp function keeps 0 bytes"));
        assert!(forward(Framework::Pytorch, "loss", false, 0).starts_with("Under torch.no_grad()"));
        assert_eq!(
            backward(Framework::Tensorflow, false, 0, 4 << 20),
            "tape.gradient released the saved tensors as it walked the tape and returned the gradients, new tensors that live as long as Python keeps them (allocated rose by 4.00 MiB)."
        );
        assert!(backward(Framework::Pytorch, false, 4 << 20, 0)
            .ends_with("in .grad (allocated fell by 4.00 MiB)."));
        assert_eq!(
            zero_grad(Framework::Jax, true, 4 << 20),
            "`del grads`: the last reference to the gradients went, so they died: 4.00 MiB freed."
        );
        for f in [Framework::Tensorflow, Framework::Jax] {
            for words in [
                forward(f, "l", true, 1),
                forward(f, "l", false, 1),
                backward(f, false, 0, 1),
                backward(f, true, 0, 1),
                zero_grad(f, true, 1),
                zero_grad(f, false, 1),
            ] {
                assert!(
                    !words.contains("torch") && !words.contains("in .grad"),
                    "{words}"
                );
            }
        }
    }
}

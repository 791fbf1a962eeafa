//! A `generate` under way between tokens: the cache and `generate`'s own
//! tensors kept while its caller reports and may stop.

use super::{check, Generation, HfConfig, Invalid, Sink};
use crate::params;
use crate::step::decoding::{self, Forward, Kept, Loaded};
use vramlab_core::types::Dtype;
use vramlab_train::program::{Alloc, Holds};

/// `generate`'s own tensors between tokens (their handles), and how far
/// it got.
#[derive(Clone, Copy, Debug, Default)]
struct Tokens {
    ids: Option<usize>,
    mask: Option<usize>,
    scores: Option<usize>,
    /// Positions in the cache.
    past: u64,
    /// New tokens made.
    done: u64,
}

/// A `generate` under way, played a token at a time ([`Run::token`]) on
/// a sink lent for each, so that its caller can report and stop between
/// tokens; it ends by [`Run::returns`] (a stop between tokens ends it so
/// too, as a stopping criterion does), or where its sink ran out of
/// memory.
pub struct Run {
    c: HfConfig,
    g: Generation,
    cuda: bool,
    weights: Loaded,
    cache: Vec<Kept>,
    tokens: Tokens,
}

impl Run {
    /// `generate` of `g` on a GPU, checked.
    pub fn new(c: &HfConfig, dtype: Dtype, g: Generation) -> Result<Run, Invalid> {
        Run::on(c, dtype, g, true)
    }

    pub(super) fn on(
        c: &HfConfig,
        dtype: Dtype,
        g: Generation,
        cuda: bool,
    ) -> Result<Run, Invalid> {
        check(c, g)?;
        let c = HfConfig { dtype, ..*c };
        Ok(Run {
            c,
            g,
            cuda,
            weights: Loaded::new(&params::parameters(&c)),
            cache: vec![Kept::default(); c.layers as usize],
            tokens: Tokens::default(),
        })
    }

    /// New tokens made so far.
    pub fn done(&self) -> u64 {
        self.tokens.done
    }

    /// Whether every new token is made.
    pub fn finished(&self) -> bool {
        self.tokens.done >= self.g.new_tokens
    }

    /// The next new token, on `sink`: its forward, then `generate`'s own
    /// tensors for it (the mask grown, the scores, the sequences).
    pub fn token(&mut self, sink: &mut dyn Sink) {
        if self.finished() {
            return;
        }
        let (g, k) = (self.g, self.tokens.done);
        let tokens = if k == 0 { g.prompt } else { 1 };
        let f = Forward {
            index: k,
            batch: g.batch,
            tokens,
            past: self.tokens.past,
            length: g.prompt + g.new_tokens - 1,
            cache: g.cache,
            attention: g.attention,
            cuda: self.cuda,
        };
        let logits = decoding::forward(&self.c, &self.weights, f, &mut self.cache, sink);
        let run = &mut self.tokens;
        run.past += tokens;
        let ids = |len: u64| g.batch * len * 8;
        let len = g.prompt + k;
        let mut replace = |kept: &mut Option<usize>, op, bytes, holds| {
            let made = sink.alloc(&Alloc::memory(op, bytes, holds, None));
            if let Some(old) = kept.replace(made) {
                sink.free(old);
            }
        };
        replace(&mut run.mask, "cat", ids(len + 1), Holds::Ids);
        let wide = g.batch * self.c.vocab * 4;
        replace(&mut run.scores, "_to_copy", wide, Holds::Logits);
        let next = sink.alloc(&Alloc::memory("argmax", ids(1), Holds::Ids, None));
        let longer = sink.alloc(&Alloc::memory("cat", ids(len + 1), Holds::Ids, None));
        sink.free(next);
        if let Some(old) = run.ids.replace(longer) {
            sink.free(old);
        }
        if let Some(logits) = logits {
            sink.free(logits);
        }
        run.done += 1;
    }

    /// `generate` returns, on `sink`: its scores, mask and cache go; the
    /// sequences live on in the caller.
    pub fn returns(&mut self, sink: &mut dyn Sink) {
        let run = self.tokens;
        for h in [run.scores, run.mask].into_iter().flatten() {
            sink.free(h);
        }
        for h in self.cache.iter().flat_map(Kept::handles) {
            sink.free(h);
        }
    }
}

//! A `generate` under way between tokens: the tape's state kept while
//! its caller reports and may stop.

use super::{check, Generation, HfConfig, Invalid, Layer, Sink, Tape};
use vramlab_core::types::Dtype;

/// `generate`'s own tensors between tokens, and how far it got.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Tokens {
    pub ids: Option<usize>,
    pub mask: Option<usize>,
    pub scores: Option<usize>,
    /// Positions in the cache.
    pub past: u64,
    /// New tokens made.
    pub done: u64,
}

/// A `generate` under way, played a token at a time ([`Run::token`]) on
/// a sink lent for each, so that its caller can report and stop between
/// tokens; it ends by [`Run::returns`] (a stop between tokens ends it so
/// too, as a stopping criterion does), or where its sink ran out of
/// memory.
pub struct Run {
    c: HfConfig,
    g: Generation,
    dtype: Dtype,
    cuda: bool,
    cache: Vec<Layer>,
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
        Ok(Run {
            c: *c,
            g,
            dtype,
            cuda,
            cache: vec![Layer::default(); c.layers as usize],
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

    /// The tape over this run's state, on `sink`.
    fn tape<'a>(&'a mut self, sink: &'a mut dyn Sink) -> (Tape<'a>, &'a mut Tokens) {
        let tape = Tape {
            c: &self.c,
            g: self.g,
            dtype: self.dtype,
            sink,
            cache: std::mem::take(&mut self.cache),
            layer: None,
            cuda: self.cuda,
        };
        (tape, &mut self.tokens)
    }

    /// The next new token, on `sink`.
    pub fn token(&mut self, sink: &mut dyn Sink) {
        if self.finished() {
            return;
        }
        let (mut tape, tokens) = self.tape(sink);
        tape.token(tokens);
        let cache = tape.cache;
        self.cache = cache;
    }

    /// `generate` returns, on `sink`: its cache, mask and scores go.
    pub fn returns(&mut self, sink: &mut dyn Sink) {
        let (mut tape, tokens) = self.tape(sink);
        let tokens = *tokens;
        tape.returns(&tokens);
    }
}

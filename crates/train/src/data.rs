//! A synthetic classification set with real structure: each class is a
//! Gaussian cluster around its own mean, so a model can learn it. Samples
//! are generated on demand from (seed, index), never stored: a 60,000 x 784
//! set costs nothing until a batch is asked for.

use vramlab_core::hash::mix3 as hash;

/// A standard normal number from a hash (Marsaglia's polar method: a
/// point drawn in the unit disc, rehashed until it falls inside; float32
/// `logf` and `sqrt`, the same to the bit on every target).
pub fn gaussian(a: u64, b: u64, c: u64) -> f32 {
    let mut h = hash(a, b, c);
    loop {
        let unit = |bits: u64| (bits & 0xff_ffff) as f32 / (1 << 23) as f32 - 1.0;
        let (u, v) = (unit(h >> 40), unit(h >> 16));
        let s = u * u + v * v;
        if s > 0.0 && s < 1.0 {
            return u * (-2.0 * libm::logf(s) / s).sqrt();
        }
        h = hash(h, c, b);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Synthetic {
    pub samples: u64,
    pub features: u64,
    pub classes: u64,
    pub seed: u64,
}

impl Synthetic {
    pub fn label(&self, index: u64) -> usize {
        (hash(self.seed, index, 7) % self.classes) as usize
    }

    /// A batch of `batch` samples starting at `start` (wrapping around).
    pub fn batch(&self, start: u64, batch: u64) -> (Vec<f32>, Vec<usize>) {
        let f = self.features as usize;
        let mut x = Vec::with_capacity(batch as usize * f);
        let mut y = Vec::with_capacity(batch as usize);
        for k in 0..batch {
            let i = (start + k) % self.samples;
            let c = self.label(i);
            for j in 0..self.features {
                let mean = gaussian(self.seed ^ 0xc1a55, c as u64, j);
                x.push(mean + 0.8 * gaussian(self.seed, i, j));
            }
            y.push(c);
        }
        (x, y)
    }
}

impl Synthetic {
    /// A language model's batch of `batch` sequences of `features` tokens
    /// from `classes` (the vocabulary), starting at sample `start`: each
    /// counts up from its own first token by its own stride (1 to 4),
    /// wrapping around the vocabulary, and each target is the token that
    /// follows. Predicting it needs the context (the stride is seen only
    /// from two tokens), so attention has something to learn. As floats:
    /// the token ids (batch x features), the targets.
    pub fn sequences(&self, start: u64, batch: u64) -> (Vec<f32>, Vec<f32>) {
        let (len, vocab) = (self.features, self.classes.max(1));
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for k in 0..batch {
            let i = (start + k) % self.samples.max(1);
            let first = hash(self.seed, i, 13) % vocab;
            let stride = 1 + hash(self.seed, i, 17) % 4;
            let token = |j: u64| ((first + j * stride) % vocab) as f32;
            x.extend((0..len).map(token));
            y.extend((1..=len).map(token));
        }
        (x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_deterministic_and_labels_cover_classes() {
        let d = Synthetic {
            samples: 100,
            features: 4,
            classes: 3,
            seed: 1,
        };
        assert_eq!(d.batch(5, 10), d.batch(5, 10));
        let (_, y) = d.batch(0, 100);
        for c in 0..3 {
            assert!(y.contains(&c));
        }
        let s = Synthetic {
            samples: 10,
            features: 5,
            classes: 7,
            seed: 3,
        };
        let (x, y) = s.sequences(8, 3);
        assert_eq!((x.len(), y.len()), (15, 15));
        // Each target is the next token; the third sample wraps to the first.
        assert_eq!(x[1..5], y[..4]);
        assert_eq!(s.sequences(0, 1), (x[10..].to_vec(), y[10..].to_vec()));
        let g: Vec<f32> = (0..2000).map(|i| gaussian(1, i, 2)).collect();
        let mean = g.iter().sum::<f32>() / g.len() as f32;
        assert!(mean.abs() < 0.1, "{mean}");
    }
}

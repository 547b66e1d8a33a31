//! Dense bit matrices: one row of chunk bits per node.
//!
//! Candidate search in the greedy matcher is a word-parallel AND of two rows, so the
//! rows are stored contiguously and scanned 64 chunks at a time.

#[derive(Clone)]
pub struct BitMatrix {
    words: usize,
    bits: Vec<u64>,
}

impl BitMatrix {
    pub fn new(rows: usize, cols: usize) -> Self {
        let words = cols.div_ceil(64).max(1);
        BitMatrix { words, bits: vec![0; rows * words] }
    }

    #[inline]
    pub fn get(&self, row: usize, col: usize) -> bool {
        self.bits[row * self.words + col / 64] >> (col % 64) & 1 == 1
    }

    #[inline]
    pub fn set(&mut self, row: usize, col: usize) {
        self.bits[row * self.words + col / 64] |= 1 << (col % 64);
    }

    #[inline]
    pub fn clear(&mut self, row: usize, col: usize) {
        self.bits[row * self.words + col / 64] &= !(1 << (col % 64));
    }

    #[inline]
    pub fn row(&self, row: usize) -> &[u64] {
        &self.bits[row * self.words..(row + 1) * self.words]
    }

    /// Word `index` of `row`: 64 chunk bits, for word-parallel candidate tests.
    #[inline]
    pub fn word(&self, row: usize, index: usize) -> u64 {
        self.bits[row * self.words + index]
    }

    pub fn words_per_row(&self) -> usize {
        self.words
    }
}

/// The first column `c` in `[lo, hi)`, at or cyclically after `from`, whose bit is set in
/// `word(c / 64)` and that `accept` takes. Starting at a random `from` gives a uniform-ish
/// random choice among candidates at the cost of one linear scan.
#[inline]
pub fn cyclic_find<W, A>(lo: usize, hi: usize, from: usize, word: W, mut accept: A) -> Option<usize>
where
    W: Fn(usize) -> u64,
    A: FnMut(usize) -> bool,
{
    let mut scan = |a: usize, b: usize| -> Option<usize> {
        if a >= b {
            return None;
        }
        for w in a / 64..=(b - 1) / 64 {
            let base = w * 64;
            let mut x = word(w);
            if a > base {
                x &= !0u64 << (a - base);
            }
            if b < base + 64 {
                x &= (1u64 << (b - base)) - 1;
            }
            while x != 0 {
                let c = base + x.trailing_zeros() as usize;
                if accept(c) {
                    return Some(c);
                }
                x &= x - 1;
            }
        }
        None
    };
    if lo >= hi {
        return None;
    }
    let from = from.clamp(lo, hi - 1);
    scan(from, hi).or_else(|| scan(lo, from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_clear() {
        let mut m = BitMatrix::new(3, 130);
        m.set(2, 129);
        m.set(0, 0);
        assert!(m.get(2, 129) && m.get(0, 0) && !m.get(1, 5));
        m.clear(2, 129);
        assert!(!m.get(2, 129));
    }

    #[test]
    fn cyclic_scan_wraps_and_respects_range() {
        let mut m = BitMatrix::new(1, 200);
        for c in [3usize, 70, 150] {
            m.set(0, c);
        }
        let row = m.row(0).to_vec();
        let pick = |w: usize| row[w];
        let cyclic_first = |lo, hi, from, word: &dyn Fn(usize) -> u64| cyclic_find(lo, hi, from, word, |_| true);
        assert_eq!(cyclic_first(0, 200, 71, &pick), Some(150));
        assert_eq!(cyclic_first(0, 200, 151, &pick), Some(3));
        assert_eq!(cyclic_first(4, 150, 100, &pick), Some(70));
        assert_eq!(cyclic_first(71, 150, 71, &pick), None);
        assert_eq!(cyclic_find(0, 200, 0, pick, |c| c > 100), Some(150));
        assert_eq!(cyclic_first(5, 5, 5, &pick), None);
    }
}

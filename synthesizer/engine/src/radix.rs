//! Stable sorts for the simulator's keys.
//!
//! The congestion simulator sorts millions of keys a few times per schedule (a chunk range's
//! ends per node, arrivals per atom, transfers by planned start). Keys of up to 32 bits (a
//! node and chunk, an atom) go by an LSD radix sort, a few linear passes where a comparison
//! sort takes `log n` of them; wider ones (times, as `time_key`s) by a comparison sort.

use rayon::prelude::*;

const DIGIT: u32 = 10;

/// The stable order of `keys` ascending: `order[k]` is the index of the k-th smallest key,
/// equal keys by index.
pub fn argsort(keys: &[u64]) -> Vec<u32> {
    let mut order = Vec::with_capacity(keys.len());
    in_order(keys, |_, i| order.push(i));
    order
}

/// Calls `visit(key, index)` for every key, in stable ascending order of keys (see `sorted`).
pub fn in_order(keys: &[u64], mut visit: impl FnMut(u64, u32)) {
    match sorted(keys) {
        Sorted::Packed(packed) => packed.into_iter().for_each(|k| visit(k >> 32, k as u32)),
        Sorted::Pairs(pairs) => pairs.into_iter().for_each(|(k, i)| visit(k, i)),
    }
}

/// `keys` with their indices in stable ascending order of keys.
enum Sorted {
    /// `key << 32 | index`, for keys of up to 32 bits
    Packed(Vec<u64>),
    Pairs(Vec<(u64, u32)>),
}

/// Keys of up to 32 bits go packed with their index into one word, radix sorted by 10-bit
/// digits (a digit that every key shares costs no pass); wider keys by a comparison sort of
/// (key, index). Large inputs are sorted on every core: the simulator sorts millions of keys
/// per schedule.
fn sorted(keys: &[u64]) -> Sorted {
    let n = keys.len();
    assert!(n <= u32::MAX as usize, "radix sort: more than 2^32 keys");
    let top = keys.par_iter().with_min_len(PAR_MIN).copied().reduce(|| 0u64, |a, b| a | b);
    let bits = 64 - top.leading_zeros();
    if bits > 32 {
        let mut pairs: Vec<(u64, u32)> =
            keys.par_iter().with_min_len(PAR_MIN).enumerate().map(|(i, &k)| (k, i as u32)).collect();
        pairs.par_sort_unstable();
        return Sorted::Pairs(pairs);
    }
    let mut packed: Vec<u64> = keys
        .par_iter()
        .with_min_len(PAR_MIN)
        .enumerate()
        .map(|(i, &k)| (k << 32) | i as u64)
        .collect();
    let mut spare = vec![0u64; n];
    for shift in (32..32 + bits).step_by(DIGIT as usize) {
        if scatter_by_digit(&packed, &mut spare, shift) {
            std::mem::swap(&mut packed, &mut spare);
        }
    }
    Sorted::Packed(packed)
}

const BUCKETS: usize = 1 << DIGIT;
/// Inputs below this many keys are handled on one core.
const PAR_MIN: usize = 1 << 16;

/// The length of the contiguous parts `n` items are cut into, one per core (one part below
/// `2 * PAR_MIN`, where splitting costs more than it saves).
fn part_size(n: usize) -> usize {
    let parts = if n < 2 * PAR_MIN { 1 } else { rayon::current_num_threads().clamp(1, 16) };
    n.div_ceil(parts).max(1)
}

/// One stable LSD pass: `from` into `to` by the digit at `shift`; false (and `to` left as
/// it was) where every key has the same digit. Each of a few contiguous parts counts its
/// digits, and writes its keys from its own offsets, so the parts run on separate cores.
fn scatter_by_digit(from: &[u64], to: &mut [u64], shift: u32) -> bool {
    let n = from.len();
    let mask = (BUCKETS - 1) as u64;
    let digit = |k: u64| ((k >> shift) & mask) as usize;
    let size = part_size(n);
    let counts: Vec<Vec<usize>> = from
        .par_chunks(size)
        .map(|part| {
            let mut count = vec![0usize; BUCKETS];
            for &k in part {
                count[digit(k)] += 1;
            }
            count
        })
        .collect();
    let mut total = vec![0usize; BUCKETS];
    for count in &counts {
        for (t, c) in total.iter_mut().zip(count) {
            *t += c;
        }
    }
    if total.contains(&n) {
        return false; // every key has this digit: the pass would not move anything
    }
    // part p's keys of digit b go after every smaller digit's and after parts < p's of b
    let mut starts = vec![vec![0usize; BUCKETS]; counts.len()];
    let mut at = 0usize;
    for b in 0..BUCKETS {
        for (p, count) in counts.iter().enumerate() {
            starts[p][b] = at;
            at += count[b];
        }
    }
    let out = SharedSlice::new(to);
    from.par_chunks(size).zip(starts.into_par_iter()).for_each(|(part, mut next)| {
        for &k in part {
            let b = digit(k);
            // SAFETY: the parts' ranges [starts[p][b], starts[p][b] + counts[p][b]) are
            // disjoint and within `to`, and each part writes only its own.
            unsafe { out.write(next[b], k) };
            next[b] += 1;
        }
    });
    true
}

/// A slice that parts running on several cores write at disjoint indices.
#[derive(Clone, Copy)]
pub struct SharedSlice<T>(*mut T, usize);
// SAFETY: writes go through `write` only, at indices the caller keeps disjoint.
unsafe impl<T: Send> Send for SharedSlice<T> {}
unsafe impl<T: Send> Sync for SharedSlice<T> {}

impl<T> SharedSlice<T> {
    pub fn new(slice: &mut [T]) -> Self {
        Self(slice.as_mut_ptr(), slice.len())
    }

    /// # Safety
    /// No other part writes index `i` at the same time.
    pub unsafe fn write(&self, i: usize, value: T) {
        assert!(i < self.1, "shared slice: index out of range");
        unsafe { *self.0.add(i) = value };
    }
}

/// An order-preserving map of a time to an unsigned key (`f64::total_cmp`'s order, but
/// for the two zeros, which are equal).
pub fn time_key(x: f64) -> u64 {
    let bits = (x + 0.0).to_bits(); // -0.0 as 0.0, as NumPy sorts them
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    }
}

/// Distinct `values` ascending and each value's index among them.
pub fn unique_inverse(values: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let low = values.iter().copied().min().unwrap_or(0);
    let keys: Vec<u64> = values.iter().map(|&v| v.wrapping_sub(low) as u64).collect();
    let (distinct, inverse) = distinct_inverse(&keys);
    (distinct.into_iter().map(|k| (k as i64).wrapping_add(low)).collect(), inverse)
}

/// Distinct `keys` ascending and each key's index among them.
pub fn distinct_inverse(keys: &[u64]) -> (Vec<u64>, Vec<i64>) {
    let mut inverse = vec![0i64; keys.len()];
    let distinct = match sorted(keys) {
        Sorted::Packed(p) => number_runs(&p, |&k| (k >> 32, k as u32), &mut inverse),
        Sorted::Pairs(p) => number_runs(&p, |&(k, i)| (k, i), &mut inverse),
    };
    (distinct, inverse)
}

/// The distinct keys of `sorted` (ascending (key, index) items), and in `inverse[index]`
/// each key's place among them. The inverse is written at scattered places, which cost a
/// cache miss each: contiguous parts of the sorted run go on separate cores.
fn number_runs<T: Sync>(sorted: &[T], item: impl Fn(&T) -> (u64, u32) + Sync,
                        inverse: &mut [i64]) -> Vec<u64> {
    let size = part_size(sorted.len());
    // each part's distinct keys, a key continuing the previous part's run not counted again
    let firsts: Vec<Vec<u64>> = sorted
        .par_chunks(size)
        .enumerate()
        .map(|(p, part)| {
            let mut last = if p == 0 { None } else { Some(item(&sorted[p * size - 1]).0) };
            let mut keys = Vec::new();
            for x in part {
                let k = item(x).0;
                if last != Some(k) {
                    keys.push(k);
                    last = Some(k);
                }
            }
            keys
        })
        .collect();
    let mut before = Vec::with_capacity(firsts.len());
    let mut total = 0i64;
    for f in &firsts {
        before.push(total);
        total += f.len() as i64;
    }
    let out = SharedSlice::new(inverse);
    sorted.par_chunks(size).enumerate().for_each(|(p, part)| {
        let mut last = if p == 0 { None } else { Some(item(&sorted[p * size - 1]).0) };
        let mut place = before[p] - 1;
        for x in part {
            let (k, i) = item(x);
            if last != Some(k) {
                place += 1;
                last = Some(k);
            }
            // SAFETY: every index appears once in `sorted`, so no two parts write one place.
            unsafe { out.write(i as usize, place) };
        }
    });
    firsts.concat()
}

/// A counting sort of `0..keys.len()` by `keys` (each below `buckets`), stable: the order,
/// and per bucket where its run starts (`buckets + 1` pointers).
pub fn by_bucket(keys: impl Iterator<Item = usize> + Clone, buckets: usize) -> (Vec<u32>, Vec<i64>) {
    let mut ptr = vec![0i64; buckets + 1];
    for k in keys.clone() {
        ptr[k + 1] += 1;
    }
    for b in 0..buckets {
        ptr[b + 1] += ptr[b];
    }
    let mut next = ptr.clone();
    let mut order = vec![0u32; ptr[buckets] as usize];
    for (i, k) in keys.enumerate() {
        order[next[k] as usize] = i as u32;
        next[k] += 1;
    }
    (order, ptr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argsort_is_stable_and_ascending() {
        let keys = [5u64, 1 << 40, 3, 5, 0, 3, u64::MAX];
        assert_eq!(argsort(&keys), vec![4, 2, 5, 0, 3, 1, 6]);
        assert!(argsort(&[]).is_empty());
        assert_eq!(argsort(&[7, 7, 7]), vec![0, 1, 2]);
    }

    #[test]
    fn large_inputs_sort_on_several_cores_as_on_one() {
        // past PAR_MIN, narrow and wide keys alike, many of them equal
        let mut x = 12345u64;
        for bits in [20u32, 31, 40] {
            let keys: Vec<u64> = (0..(5 * PAR_MIN + 7))
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (x >> 11) & ((1u64 << bits) - 1) & !0xff
                })
                .collect();
            let mut expected: Vec<u32> = (0..keys.len() as u32).collect();
            expected.sort_by_key(|&i| keys[i as usize]);
            assert_eq!(argsort(&keys), expected, "{bits}-bit keys");
        }
    }

    #[test]
    fn large_distinct_inverse_matches_a_sort() {
        let mut x = 99u64;
        for bits in [12u32, 40] {
            let keys: Vec<u64> = (0..(3 * PAR_MIN + 11))
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (x >> 13) & ((1u64 << bits) - 1)
                })
                .collect();
            let (distinct, inverse) = distinct_inverse(&keys);
            let mut expected = keys.clone();
            expected.sort_unstable();
            expected.dedup();
            assert_eq!(distinct, expected, "{bits}-bit keys");
            for (i, &k) in keys.iter().enumerate() {
                assert_eq!(distinct[inverse[i] as usize], k);
            }
        }
    }

    #[test]
    fn time_keys_order_as_times() {
        let times = [-2.5, -1e-300, -0.0, 0.0, 1e-300, 0.5, 3.0, f64::INFINITY];
        for w in times.windows(2) {
            assert!(time_key(w[0]) <= time_key(w[1]), "{w:?}");
        }
        assert!(time_key(0.5) < time_key(0.5 + 1e-12));
        assert_eq!(time_key(-0.0), time_key(0.0));
    }

    #[test]
    fn unique_inverse_of_negative_and_repeated_values() {
        let (distinct, inverse) = unique_inverse(&[4, -3, 4, i64::MAX, -3, 0]);
        assert_eq!(distinct, vec![-3, 0, 4, i64::MAX]);
        assert_eq!(inverse, vec![2, 0, 2, 3, 0, 1]);
    }

    #[test]
    fn counting_sort_keeps_order_within_a_bucket() {
        let keys = [2usize, 0, 2, 1, 0];
        let (order, ptr) = by_bucket(keys.iter().copied(), 3);
        assert_eq!(order, vec![1, 4, 3, 0, 2]);
        assert_eq!(ptr, vec![0, 2, 3, 5]);
    }
}

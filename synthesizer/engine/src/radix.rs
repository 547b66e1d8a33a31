//! Stable sorts for the simulator's keys.
//!
//! The congestion simulator sorts millions of keys a few times per schedule (a chunk range's
//! ends per node, arrivals per atom, transfers by planned start). Keys of up to 32 bits (a
//! node and chunk, an atom) go by an LSD radix sort, a few linear passes where a comparison
//! sort takes `log n` of them; wider ones (times, as `time_key`s) by a comparison sort.

const DIGIT: u32 = 10;

/// The stable order of `keys` ascending: `order[k]` is the index of the k-th smallest key,
/// equal keys by index.
pub fn argsort(keys: &[u64]) -> Vec<u32> {
    let mut order = Vec::with_capacity(keys.len());
    in_order(keys, |_, i| order.push(i));
    order
}

/// Calls `visit(key, index)` for every key, in stable ascending order of keys. Keys of up to
/// 32 bits go packed with their index into one word, radix sorted by 10-bit digits (a digit
/// that every key shares costs no pass); wider keys by a comparison sort of (key, index).
pub fn in_order(keys: &[u64], mut visit: impl FnMut(u64, u32)) {
    let n = keys.len();
    assert!(n <= u32::MAX as usize, "radix sort: more than 2^32 keys");
    let top = keys.iter().copied().fold(0u64, |a, b| a | b);
    let bits = 64 - top.leading_zeros();
    if bits > 32 {
        let mut pairs: Vec<(u64, u32)> =
            keys.iter().enumerate().map(|(i, &k)| (k, i as u32)).collect();
        pairs.sort_unstable();
        pairs.into_iter().for_each(|(k, i)| visit(k, i));
        return;
    }
    let mut packed: Vec<u64> = keys.iter().enumerate().map(|(i, &k)| (k << 32) | i as u64).collect();
    let mut spare = vec![0u64; n];
    let buckets = 1usize << DIGIT;
    let mask = (buckets - 1) as u64;
    for shift in (32..32 + bits).step_by(DIGIT as usize) {
        let mut count = vec![0usize; buckets];
        for &k in &packed {
            count[((k >> shift) & mask) as usize] += 1;
        }
        if count.contains(&n) {
            continue; // every key has this digit: the pass would not move anything
        }
        let mut next = vec![0usize; buckets];
        for b in 1..buckets {
            next[b] = next[b - 1] + count[b - 1];
        }
        for &k in &packed {
            let b = ((k >> shift) & mask) as usize;
            spare[next[b]] = k;
            next[b] += 1;
        }
        std::mem::swap(&mut packed, &mut spare);
    }
    packed.into_iter().for_each(|k| visit(k >> 32, k as u32));
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
    let mut distinct: Vec<u64> = Vec::new();
    let mut inverse = vec![0i64; keys.len()];
    in_order(keys, |k, i| {
        if distinct.last() != Some(&k) {
            distinct.push(k);
        }
        inverse[i as usize] = distinct.len() as i64 - 1;
    });
    (distinct, inverse)
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

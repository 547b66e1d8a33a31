//! Cheapest paths from many sources to a few targets each (Dijkstra with an early stop).
//!
//! The same search as `choreo.routing.Router.search`: the heap orders by (distance, node),
//! a link replaces a node's predecessor only when strictly cheaper, and out-links are relaxed
//! in the order given, so both give identical routes. A 16,384-GPU fabric needs one search per
//! source GPU, each settling thousands of nodes behind a rail switch: too slow in Python.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// The fabric's usable out-links per node (CSR) with each link's head and cost.
pub struct Graph<'a> {
    pub adj_ptr: &'a [i64],
    pub adj_link: &'a [i64],
    pub adj_head: &'a [i64],
    pub adj_cost: &'a [f64],
    pub link_src: &'a [i64],
}

#[derive(PartialEq)]
struct Entry(f64, usize);

impl Eq for Entry {}

impl Ord for Entry {
    /// Reversed, so the max-heap pops the smallest (distance, node) first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then_with(|| other.1.cmp(&self.1))
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Cheapest cost of each (tail, head) link, for two-hop bounds.
fn link_costs(g: &Graph, n: usize) -> HashMap<(usize, usize), f64> {
    let mut cost = HashMap::new();
    for v in 0..n {
        for k in g.adj_ptr[v] as usize..g.adj_ptr[v + 1] as usize {
            let e = cost.entry((v, g.adj_head[k] as usize)).or_insert(f64::INFINITY);
            *e = f64::min(*e, g.adj_cost[k]);
        }
    }
    cost
}

/// An upper bound on every target's distance from `s`: the dearest of their cheapest paths of
/// one or two hops (infinite when some target has none). A node reached at this cost or more
/// cannot lie on a cheapest path to any target (costs are positive), so it need not be
/// queued: behind a rail switch that skips the thousands of NPUs that are not targets.
fn two_hop_bound(g: &Graph, cost: &HashMap<(usize, usize), f64>, s: usize, targets: &[i64]) -> f64 {
    let mut worst: f64 = 0.0;
    for &t in targets {
        let t = t as usize;
        if t == s {
            continue;
        }
        let mut best = cost.get(&(s, t)).copied().unwrap_or(f64::INFINITY);
        for k in g.adj_ptr[s] as usize..g.adj_ptr[s + 1] as usize {
            let w = g.adj_head[k] as usize;
            if let Some(c) = cost.get(&(w, t)) {
                best = best.min(g.adj_cost[k] + c);
            }
        }
        worst = worst.max(best);
    }
    worst
}

/// For each source `sources[i]` and each of its targets `targets[ptr[i]..ptr[i + 1]]`, the
/// fabric links of the cheapest path in order, concatenated: returns (path_ptr, path_links)
/// with one path per (source, target) in input order. Errors name the first unreachable pair.
/// Identical to the search without the two-hop bound (`two_hop_bound`), only faster.
pub fn paths(g: &Graph, sources: &[i64], ptr: &[i64], targets: &[i64])
    -> Result<(Vec<i64>, Vec<i64>), String> {
    let n = g.adj_ptr.len().saturating_sub(1);
    if ptr.len() != sources.len() + 1 {
        return Err("target pointer length must be sources + 1".into());
    }
    // The two-hop bound needs positive costs (a free link could extend a path at no cost).
    let positive = g.adj_cost.iter().all(|&c| c > 0.0);
    let cost = if positive { link_costs(g, n) } else { HashMap::new() };
    let mut dist = vec![f64::INFINITY; n];
    let mut pred = vec![-1i64; n];
    let mut done = vec![false; n];
    let mut wanted = vec![false; n];
    let mut touched: Vec<usize> = Vec::new();
    let mut heap = BinaryHeap::new();
    let mut path_ptr = vec![0i64];
    let mut path_links = Vec::new();
    let mut hops = Vec::new();
    for (i, &s) in sources.iter().enumerate() {
        let s = index(s, n)?;
        let (lo, hi) = (ptr[i] as usize, ptr[i + 1] as usize);
        let mut left = 0usize;
        for &t in &targets[lo..hi] {
            let t = index(t, n)?;
            if t != s && !wanted[t] {
                wanted[t] = true;
                left += 1;
            }
        }
        let bound = if positive {
            two_hop_bound(g, &cost, s, &targets[lo..hi])
        } else {
            f64::INFINITY
        };
        dist[s] = 0.0;
        touched.push(s);
        heap.push(Entry(0.0, s));
        let mut settled_any = false;
        while left > 0 || !settled_any {
            let Some(Entry(d, v)) = heap.pop() else { break };
            if done[v] {
                continue;
            }
            done[v] = true;
            settled_any = true;
            if wanted[v] {
                wanted[v] = false;
                left -= 1;
            }
            for k in g.adj_ptr[v] as usize..g.adj_ptr[v + 1] as usize {
                let w = g.adj_head[k] as usize;
                let nd = d + g.adj_cost[k];
                // At the bound, not below it: in floating point a tiny last hop can add
                // nothing, so a node on the cheapest path may cost the bound itself.
                if nd < dist[w] && (nd <= bound || wanted[w]) {
                    if dist[w].is_infinite() {
                        touched.push(w);
                    }
                    dist[w] = nd;
                    pred[w] = g.adj_link[k];
                    heap.push(Entry(nd, w));
                }
            }
        }
        for &t in &targets[lo..hi] {
            let t = t as usize;
            hops.clear();
            let mut v = t;
            while v != s {
                let link = pred[v];
                if link < 0 || !done[v] {
                    return Err(format!("no usable path from node {s} to node {t}"));
                }
                hops.push(link);
                v = g.link_src[link as usize] as usize;
            }
            path_links.extend(hops.iter().rev());
            path_ptr.push(path_links.len() as i64);
        }
        for &v in &touched {
            dist[v] = f64::INFINITY;
            pred[v] = -1;
            done[v] = false;
        }
        for &t in &targets[lo..hi] {
            wanted[t as usize] = false;
        }
        touched.clear();
        heap.clear();
    }
    Ok((path_ptr, path_links))
}

fn index(v: i64, n: usize) -> Result<usize, String> {
    usize::try_from(v).ok().filter(|&v| v < n).ok_or_else(|| format!("node {v} out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0 -> 1 -> 2 cheap, 0 -> 2 direct but dearer; 3 unreachable.
    #[test]
    fn cheapest_path_and_unreachable() {
        let link_src = [0i64, 1, 0];
        let g = Graph {
            adj_ptr: &[0, 2, 3, 3, 3],
            adj_link: &[0, 2, 1],
            adj_head: &[1, 2, 2],
            adj_cost: &[1.0, 5.0, 1.0],
            link_src: &link_src,
        };
        let (ptr, links) = paths(&g, &[0, 1], &[0, 2, 3], &[2, 1, 2]).unwrap();
        assert_eq!(ptr, vec![0, 2, 3, 4]);
        assert_eq!(links, vec![0, 1, 0, 1]);
        assert!(paths(&g, &[0], &[0, 1], &[3]).is_err());
    }

    /// 1 -> 0 costs 1.0995e12 (1 TiB over 1 B/s), 0 -> 2 costs 1e-6: in floating point the
    /// sum is 1.0995e12 again, so node 0 costs exactly the two-hop bound and must be kept.
    #[test]
    fn a_node_at_the_bound_is_kept() {
        let link_src = [1i64, 0, 0, 2];
        let g = Graph {
            adj_ptr: &[0, 2, 3, 4],
            adj_link: &[2, 1, 0, 3],
            adj_head: &[1, 2, 0, 0],
            adj_cost: &[1.0, 1e-6, 1.0995e12, 1e-6],
            link_src: &link_src,
        };
        let (ptr, links) = paths(&g, &[1], &[0, 1], &[2]).unwrap();
        assert_eq!((ptr, links), (vec![0, 2], vec![0, 1]));
    }
}

//! Cheapest paths from many sources to a few targets each (Dijkstra with an early stop).
//!
//! The same search as `choreo.routing.Router.search`: the heap orders by (distance, node),
//! a link replaces a node's predecessor only when strictly cheaper, and out-links are relaxed
//! in the order given, so both give identical routes. A 16,384-GPU fabric needs one search per
//! source GPU, each settling thousands of nodes behind a rail switch: too slow in Python.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use rayon::prelude::*;

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

/// Each node's cheapest out-link (infinite where it has none): a path on from a node reached
/// at `d` costs at least `d + min_out`.
fn min_out(g: &Graph, n: usize) -> Vec<f64> {
    (0..n)
        .map(|v| g.adj_cost[g.adj_ptr[v] as usize..g.adj_ptr[v + 1] as usize]
            .iter().copied().fold(f64::INFINITY, f64::min))
        .collect()
}

/// What bounds the searches where every cost is positive: the cheapest link between each
/// pair of nodes (for `two_hop_bound`) and each node's cheapest way on (`min_out`).
struct Pruning {
    cost: HashMap<(usize, usize), f64>,
    onward: Vec<f64>,
}

/// An upper bound on every target's distance from `s`: the dearest of their cheapest paths of
/// one or two hops (infinite when some target has none). A node other than a target whose
/// every way on costs more than this (its cost plus its cheapest out-link, as rounded) cannot
/// lie on a cheapest path to any target (costs are positive), so it need not be queued:
/// behind a rail switch that skips the thousands of NPUs that are not targets, though they
/// cost the bound itself.
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

/// Sources per parallel block: a block's searches share one set of per-node arrays.
const BLOCK: usize = 256;

/// Paths as CSR: (path_ptr, path_links), or a block's (lengths, links).
type Paths = (Vec<i64>, Vec<i64>);

/// For each source `sources[i]` and each of its targets `targets[ptr[i]..ptr[i + 1]]`, the
/// fabric links of the cheapest path in order, concatenated: returns (path_ptr, path_links)
/// with one path per (source, target) in input order. Errors name the first unreachable pair.
/// Identical to the search without the two-hop bound (`two_hop_bound`), only faster. The
/// searches are independent, so blocks of sources run on all cores.
pub fn paths(g: &Graph, sources: &[i64], ptr: &[i64], targets: &[i64])
    -> Result<Paths, String> {
    let n = g.adj_ptr.len().saturating_sub(1);
    if ptr.len() != sources.len() + 1 {
        return Err("target pointer length must be sources + 1".into());
    }
    // Every index checked before any search, so a search cannot stop halfway and leave its
    // thread's arrays marked for the next one.
    if ptr.first() != Some(&0) || ptr.windows(2).any(|w| w[0] > w[1])
        || ptr[ptr.len() - 1] as usize != targets.len() {
        return Err("target pointers must rise from 0 to the number of targets".into());
    }
    for &v in sources.iter().chain(targets) {
        index(v, n)?;
    }
    // The two-hop bound needs positive costs (a free link could extend a path at no cost).
    let positive = g.adj_cost.iter().all(|&c| c > 0.0);
    let pruning = positive.then(|| Pruning { cost: link_costs(g, n), onward: min_out(g, n) });
    let starts: Vec<usize> = (0..sources.len()).step_by(BLOCK).collect();
    let blocks: Vec<Result<Paths, String>> = starts
        .par_iter()
        .map_init(
            || Search::new(n),
            |search, &first| {
                let mut lengths = Vec::new();
                let mut links = Vec::new();
                for i in first..(first + BLOCK).min(sources.len()) {
                    let (lo, hi) = (ptr[i] as usize, ptr[i + 1] as usize);
                    search.run(g, pruning.as_ref(), sources[i], &targets[lo..hi], &mut lengths,
                               &mut links)?;
                }
                Ok((lengths, links))
            },
        )
        .collect();
    let mut path_ptr = vec![0i64];
    let mut path_links = Vec::new();
    for block in blocks {
        let (lengths, links) = block?;
        for len in lengths {
            path_ptr.push(path_ptr[path_ptr.len() - 1] + len);
        }
        path_links.extend(links);
    }
    Ok((path_ptr, path_links))
}

/// One thread's per-node search state, reset after each search (only what it touched).
struct Search {
    dist: Vec<f64>,
    pred: Vec<i64>,
    done: Vec<bool>,
    wanted: Vec<bool>,
    touched: Vec<usize>,
    heap: BinaryHeap<Entry>,
    hops: Vec<i64>,
}

impl Search {
    fn new(n: usize) -> Self {
        Search {
            dist: vec![f64::INFINITY; n],
            pred: vec![-1; n],
            done: vec![false; n],
            wanted: vec![false; n],
            touched: Vec::new(),
            heap: BinaryHeap::new(),
            hops: Vec::new(),
        }
    }

    /// The paths from `s` to each of `targets` in order: each path's length pushed on
    /// `lengths`, its links on `links`.
    fn run(&mut self, g: &Graph, pruning: Option<&Pruning>, s: i64, targets: &[i64],
           lengths: &mut Vec<i64>, links: &mut Vec<i64>) -> Result<(), String> {
        let s = s as usize; // `paths` has checked every index
        let mut left = 0usize;
        for &t in targets {
            let t = t as usize;
            if t != s && !self.wanted[t] {
                self.wanted[t] = true;
                left += 1;
            }
        }
        match pruning {
            Some(p) => self.settle(g, s, left, two_hop_bound(g, &p.cost, s, targets), &p.onward),
            None => self.settle(g, s, left, f64::INFINITY, &[]),
        }
        let out = (|| {
            for &t in targets {
                let t = t as usize;
                self.hops.clear();
                let mut v = t;
                while v != s {
                    let link = self.pred[v];
                    if link < 0 || !self.done[v] {
                        return Err(format!("no usable path from node {s} to node {t}"));
                    }
                    self.hops.push(link);
                    v = g.link_src[link as usize] as usize;
                }
                lengths.push(self.hops.len() as i64);
                links.extend(self.hops.iter().rev());
            }
            Ok(())
        })();
        for &v in &self.touched {
            self.dist[v] = f64::INFINITY;
            self.pred[v] = -1;
            self.done[v] = false;
        }
        for &t in targets {
            self.wanted[t as usize] = false;
        }
        self.touched.clear();
        self.heap.clear();
        out
    }

    /// Dijkstra from `s` until the `left` wanted nodes are settled, queuing only targets and
    /// nodes whose way on (`onward`, per node) may stay within `bound`; an infinite bound
    /// with no `onward` queues every node reached.
    fn settle(&mut self, g: &Graph, s: usize, mut left: usize, bound: f64, onward: &[f64]) {
        self.dist[s] = 0.0;
        self.touched.push(s);
        self.heap.push(Entry(0.0, s));
        let mut settled_any = false;
        while left > 0 || !settled_any {
            let Some(Entry(d, v)) = self.heap.pop() else { break };
            if self.done[v] {
                continue;
            }
            self.done[v] = true;
            settled_any = true;
            if self.wanted[v] {
                self.wanted[v] = false;
                left -= 1;
            }
            for k in g.adj_ptr[v] as usize..g.adj_ptr[v + 1] as usize {
                let w = g.adj_head[k] as usize;
                let nd = d + g.adj_cost[k];
                // Its way on rounded, not its own cost: in floating point a tiny last hop
                // can add nothing, so a node on the cheapest path may cost the bound itself.
                if nd < self.dist[w]
                    && (self.wanted[w] || onward.get(w).is_none_or(|&o| nd + o <= bound)) {
                    if self.dist[w].is_infinite() {
                        self.touched.push(w);
                    }
                    self.dist[w] = nd;
                    self.pred[w] = g.adj_link[k];
                    self.heap.push(Entry(nd, w));
                }
            }
        }
    }
}

fn index(v: i64, n: usize) -> Result<usize, String> {
    usize::try_from(v).ok().filter(|&v| v < n).ok_or_else(|| format!("node {v} out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0 -> 1 -> 2 cheap, 0 -> 2 direct but dearer; 3 unreachable; bad indices refused.
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
        // bad indices and pointers are refused before any search runs
        assert_eq!(paths(&g, &[0, 1], &[0, 1, 2], &[2, 9]).err().unwrap(), "node 9 out of range");
        assert_eq!(paths(&g, &[7], &[0, 1], &[2]).err().unwrap(), "node 7 out of range");
        assert!(paths(&g, &[0, 1], &[0, 2, 1], &[2, 2]).is_err()); // pointers fall
        assert!(paths(&g, &[0], &[0, 5], &[2]).is_err()); // past the targets
        assert!(paths(&g, &[], &[0], &[]).unwrap().1.is_empty());
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

    /// A source behind a switch with 200 leaves, each at the two-hop bound: only the target
    /// leaf is queued, and the route is the one the unbounded search finds.
    #[test]
    fn leaves_at_the_bound_are_not_queued() {
        let leaves = 200i64;
        let n = leaves as usize + 2; // 0: the source, 1: the switch, then the leaves
        // links in node order: 0 -> 1, 1 -> each leaf, each leaf -> 1; every one costs 1
        let mut src = vec![0i64];
        let mut head = vec![1i64];
        src.extend(std::iter::repeat_n(1, leaves as usize));
        head.extend(2..2 + leaves);
        src.extend(2..2 + leaves);
        head.extend(std::iter::repeat_n(1, leaves as usize));
        let mut ptr = vec![0i64, 1, 1 + leaves];
        ptr.extend((1..=leaves).map(|k| 1 + leaves + k));
        let link: Vec<i64> = (0..src.len() as i64).collect();
        let cost = vec![1.0; src.len()];
        let g = Graph { adj_ptr: &ptr, adj_link: &link, adj_head: &head, adj_cost: &cost, link_src: &src };
        let target = 2 + leaves / 2;
        let (path_ptr, links) = paths(&g, &[0], &[0, 1], &[target]).unwrap();
        assert_eq!((path_ptr, links), (vec![0, 2], vec![0, target - 1]));
        let mut search = Search::new(n);
        search.wanted[target as usize] = true;
        let bound = two_hop_bound(&g, &link_costs(&g, n), 0, &[target]);
        assert_eq!(bound, 2.0);
        search.settle(&g, 0, 1, bound, &min_out(&g, n));
        assert_eq!(search.touched.len(), 3, "the source, the switch and the target only");
    }
}

//! Minimum-cost spanning arborescences (Chu-Liu/Edmonds), the pricing step of tree packing:
//! each round of `choreo.treepack` asks, for every root, for the cheapest out-tree under the
//! links' current prices. O(V E) per root; the roots run in parallel.

use rayon::prelude::*;

/// An edge of the current (possibly contracted) graph, naming the input edge it stands for.
#[derive(Clone, Copy)]
struct Edge {
    src: usize,
    dst: usize,
    cost: f64,
    orig: usize,
}

/// The input edges (indices) of a minimum-cost arborescence of `num_nodes` nodes rooted at
/// `root`, spanning every node; `None` when some node cannot be reached from the root.
pub fn min_arborescence(num_nodes: usize, src: &[u32], dst: &[u32], cost: &[f64], root: usize)
    -> Option<Vec<usize>> {
    let edges: Vec<Edge> = (0..src.len())
        .filter(|&i| src[i] != dst[i] && dst[i] as usize != root)
        .map(|i| Edge { src: src[i] as usize, dst: dst[i] as usize, cost: cost[i], orig: i })
        .collect();
    solve(num_nodes, &edges, root)
}

/// Edmonds' contraction, recursively: each node takes its cheapest entering edge; a cycle
/// among those is contracted with entering costs reduced by the cycle edge they would replace.
fn solve(n: usize, edges: &[Edge], root: usize) -> Option<Vec<usize>> {
    let mut best: Vec<Option<usize>> = vec![None; n];
    for (k, e) in edges.iter().enumerate() {
        if e.dst != root && best[e.dst].is_none_or(|b| e.cost < edges[b].cost) {
            best[e.dst] = Some(k);
        }
    }
    if (0..n).any(|v| v != root && best[v].is_none()) {
        return None;
    }
    // Find the cycles of the chosen in-edges.
    let mut comp = vec![usize::MAX; n];
    let mut mark = vec![usize::MAX; n];
    let mut cycles: Vec<Vec<usize>> = Vec::new();
    for start in 0..n {
        let mut v = start;
        while v != root && mark[v] == usize::MAX && comp[v] == usize::MAX {
            mark[v] = start;
            v = edges[best[v].unwrap()].src;
        }
        if v != root && mark[v] == start && comp[v] == usize::MAX {
            let id = cycles.len();
            let mut cycle = vec![v];
            comp[v] = id;
            let mut u = edges[best[v].unwrap()].src;
            while u != v {
                comp[u] = id;
                cycle.push(u);
                u = edges[best[u].unwrap()].src;
            }
            cycles.push(cycle);
        }
    }
    if cycles.is_empty() {
        return Some((0..n).filter(|&v| v != root).map(|v| edges[best[v].unwrap()].orig).collect());
    }
    // Contract: a cycle becomes one node; other nodes are numbered after the cycles.
    let mut next = cycles.len();
    for c in comp.iter_mut() {
        if *c == usize::MAX {
            *c = next;
            next += 1;
        }
    }
    let in_cycle = |v: usize| comp[v] < cycles.len();
    let mut reduced = Vec::with_capacity(edges.len());
    for (k, e) in edges.iter().enumerate() {
        let (a, b) = (comp[e.src], comp[e.dst]);
        if a == b {
            continue;
        }
        let cost = if in_cycle(e.dst) { e.cost - edges[best[e.dst].unwrap()].cost } else { e.cost };
        reduced.push(Edge { src: a, dst: b, cost, orig: k });
    }
    let chosen = solve(next, &reduced, comp[root])?;
    // Expand: every chosen edge stays; each cycle keeps all its edges but the one into the
    // node where the chosen edge enters it.
    let mut entered = vec![usize::MAX; cycles.len()];
    let mut out = Vec::with_capacity(n);
    for k in chosen {
        let e = &edges[k];
        if in_cycle(e.dst) {
            entered[comp[e.dst]] = e.dst;
        }
        out.push(e.orig);
    }
    for (id, cycle) in cycles.iter().enumerate() {
        for &v in cycle {
            if v != entered[id] {
                out.push(edges[best[v].unwrap()].orig);
            }
        }
    }
    Some(out)
}

/// `min_arborescence` for each root, in parallel.
pub fn min_arborescences(num_nodes: usize, src: &[u32], dst: &[u32], cost: &[f64],
                         roots: &[u32]) -> Vec<Option<Vec<usize>>> {
    roots.par_iter().map(|&r| min_arborescence(num_nodes, src, dst, cost, r as usize)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(cost: &[f64], tree: &[usize]) -> f64 {
        tree.iter().map(|&i| cost[i]).sum()
    }

    /// Every spanning arborescence by brute force: one in-edge per non-root node, acyclic.
    fn brute(n: usize, src: &[u32], dst: &[u32], cost: &[f64], root: usize) -> Option<f64> {
        let ins: Vec<Vec<usize>> = (0..n)
            .map(|v| (0..src.len()).filter(|&i| dst[i] as usize == v && src[i] != dst[i]).collect())
            .collect();
        let mut best: Option<f64> = None;
        let mut pick = vec![0usize; n];
        loop {
            let ok = (0..n).all(|v| v == root || !ins[v].is_empty());
            if !ok {
                return None;
            }
            let parent = |v: usize| src[ins[v][pick[v]]] as usize;
            let acyclic = (0..n).all(|v| {
                let mut u = v;
                for _ in 0..n {
                    if u == root {
                        return true;
                    }
                    u = parent(u);
                }
                false
            });
            if acyclic {
                let c: f64 = (0..n).filter(|&v| v != root).map(|v| cost[ins[v][pick[v]]]).sum();
                best = Some(best.map_or(c, |b: f64| b.min(c)));
            }
            let mut v = 0;
            loop {
                if v == n {
                    return best;
                }
                if v != root {
                    pick[v] += 1;
                    if pick[v] < ins[v].len() {
                        break;
                    }
                    pick[v] = 0;
                }
                v += 1;
            }
        }
    }

    #[test]
    fn matches_brute_force_on_random_graphs() {
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..300 {
            let n = rng.usize(2..6);
            let m = rng.usize(n..n * n + 2);
            let src: Vec<u32> = (0..m).map(|_| rng.u32(0..n as u32)).collect();
            let dst: Vec<u32> = (0..m).map(|_| rng.u32(0..n as u32)).collect();
            let cost: Vec<f64> = (0..m).map(|_| rng.u32(1..10) as f64).collect();
            let root = rng.usize(0..n);
            let got = min_arborescence(n, &src, &dst, &cost, root);
            let want = brute(n, &src, &dst, &cost, root);
            match (got, want) {
                (None, None) => {}
                (Some(tree), Some(w)) => {
                    assert_eq!(tree.len(), n - 1);
                    assert!((total(&cost, &tree) - w).abs() < 1e-9);
                    let mut seen = vec![false; n];
                    seen[root] = true;
                    for _ in 0..n {
                        for &i in &tree {
                            if seen[src[i] as usize] {
                                seen[dst[i] as usize] = true;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&s| s), "tree spans every node");
                }
                (g, w) => panic!("got {g:?}, want {w:?}"),
            }
        }
    }
}

//! Which of a model's workers a decision looks at. Up to [`SAMPLE_ABOVE`] workers: every one. Above that (a fleet of
//! thousands), a decision would spend most of its time visiting workers that cannot win, so it looks at the
//! workers holding a prefix of the prompt (the prefix index names them, however many there are) and at a window
//! of [`WINDOW`] consecutive others, starting where the request's key points (the session's, else the prompt's
//! first block's, else the request id's: the same conversation or prefix sees the same window, so session
//! affinity and new-prefix spreading stay stable). The power of many random choices keeps load balanced, and a
//! pool with no candidate in the sample is scanned whole before it is given up ([`super::decide`]).

use crate::hash::{FxHashMap, mix};
use crate::load::Overlap;

/// Models with at most this many workers are decided over all of them.
pub(super) const SAMPLE_ABOVE: usize = 1024;

/// Workers visited beyond the prefix's holders, above [`SAMPLE_ABOVE`].
pub(super) const WINDOW: usize = 512;

/// The (worker index, model index) pairs to visit, in worker order: the holders of `overlap` (by their load slots,
/// mapped to worker indices by `slot_worker`) among `servers`, and a window of `servers` from `key`'s position.
/// Empty when `servers` is small enough to visit whole.
pub(super) fn visit(
    servers: &[(usize, usize)],
    overlap: &FxHashMap<u32, Overlap>,
    slot_worker: &FxHashMap<u32, usize>,
    key: u64,
    out: &mut Vec<(usize, usize)>,
) {
    out.clear();
    if servers.len() <= SAMPLE_ABOVE {
        return;
    }
    let start = (mix(key) % servers.len() as u64) as usize;
    for i in 0..WINDOW {
        out.push(servers[(start + i) % servers.len()]);
    }
    // The holders: found by binary search (servers are in worker order), whatever their number.
    for slot in overlap.keys() {
        let Some(&wi) = slot_worker.get(slot) else { continue };
        if let Ok(at) = servers.binary_search_by_key(&wi, |&(w, _)| w) {
            out.push(servers[at]);
        }
    }
    out.sort_unstable();
    out.dedup();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_models_are_visited_whole_and_large_ones_as_holders_plus_a_stable_window() {
        let small: Vec<(usize, usize)> = (0..SAMPLE_ABOVE).map(|w| (w, 0)).collect();
        let mut out = vec![(9, 9)];
        visit(&small, &FxHashMap::default(), &FxHashMap::default(), 7, &mut out);
        assert!(out.is_empty(), "visit all of them");
        let large: Vec<(usize, usize)> = (0..10_000).map(|w| (w, w % 2)).collect();
        let overlap = FxHashMap::from_iter([(3, Overlap { blocks: 4, host: 0, disk: 0 }), (8, Overlap::default())]);
        let slot_worker = FxHashMap::from_iter([(3u32, 9_876usize), (8, 12)]);
        visit(&large, &overlap, &slot_worker, 42, &mut out);
        assert!(out.contains(&(9_876, 0)) && out.contains(&(12, 0)), "the holders are always visited");
        assert!(out.len() <= WINDOW + 2 && out.len() >= WINDOW);
        assert!(out.windows(2).all(|w| w[0] < w[1]), "in worker order, once each");
        let mut again = Vec::new();
        visit(&large, &overlap, &slot_worker, 42, &mut again);
        assert_eq!(out, again, "the same key sees the same window");
        visit(&large, &overlap, &slot_worker, 43, &mut again);
        assert_ne!(out, again, "another key sees another window");
    }
}

//! The block pool's tests (`pool.rs`).

use super::*;

fn run(pool: &mut BlockPool, prompt: &[u32]) -> SeqBlocks {
    let mut seq = pool.start(prompt);
    let rest = &prompt[seq.len()..];
    pool.reserve(&mut seq, rest.len()).unwrap();
    pool.commit(&mut seq, rest);
    seq
}

#[test]
fn blocks_fill_in_order_and_slots_map_positions() {
    let mut pool = BlockPool::new(8, 4);
    let seq = run(&mut pool, &[1, 2, 3, 4, 5, 6]);
    assert_eq!(seq.table().len(), 2);
    assert_eq!(pool.slot(&seq, 0), (seq.table()[0], 0));
    assert_eq!(pool.slot(&seq, 5), (seq.table()[1], 1));
    let s = pool.stats();
    assert_eq!((s.used, s.free, s.cached), (2, 6, 0));
    assert!((s.fragmentation - 0.25).abs() < 1e-6, "2 of 8 slots unused: {}", s.fragmentation);
}

#[test]
fn a_shared_prefix_is_reused_and_counted() {
    let mut pool = BlockPool::new(16, 4);
    let a = run(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(a.cached_tokens(), 0);
    let b = pool.start(&[1, 2, 3, 4, 5, 6, 7, 8, 100, 101]);
    assert_eq!(b.cached_tokens(), 8);
    assert_eq!(b.table(), &a.table()[..2]);
    let s = pool.stats();
    // The first sequence stopped looking at its first miss; the second found both blocks.
    assert_eq!((s.prefix_lookups, s.prefix_hits), (3, 2));
    assert_eq!(s.used, 3, "shared blocks count once");
}

#[test]
fn a_prefix_is_shared_within_its_cache_scope_only() {
    use zl_common::block_hash::{cache_salt, salted_block_hashes};
    let mut pool = BlockPool::new(16, 4);
    let (a, b) = (Some(cache_salt("project:a")), Some(cache_salt("project:b")));
    let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    let mut first = pool.start_salted(&prompt, a);
    pool.reserve(&mut first, prompt.len()).unwrap();
    pool.commit(&mut first, &prompt);
    // Another scope, and the unsalted chain, find nothing of it; the same scope finds both full blocks.
    assert_eq!(pool.start_salted(&prompt, b).cached_tokens(), 0);
    assert_eq!(pool.start(&prompt).cached_tokens(), 0);
    assert_eq!(pool.start_salted(&prompt, a).cached_tokens(), 8);
    // What the pool reports (and prefix-aware routing matches) is the scope's salted chain, as a frontend
    // computes it for the route.
    let stored: Vec<_> = pool
        .drain_events()
        .into_iter()
        .filter_map(|e| if let KvEvent::Stored(h) = e { Some(h) } else { None })
        .collect();
    assert_eq!(stored, salted_block_hashes(&prompt, 4, a));
}

#[test]
fn the_last_prompt_token_is_always_computed() {
    let mut pool = BlockPool::new(16, 4);
    let a = run(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8]);
    pool.release(a);
    let b = pool.start(&[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(b.cached_tokens(), 4, "the second block holds the last token, so it is recomputed");
}

#[test]
fn released_prefixes_stay_cached_until_evicted_lru_first() {
    let mut pool = BlockPool::new(3, 2);
    let a = run(&mut pool, &[1, 2, 3]); // blocks: [1,2] full+hashed, [3] partial
    let a_first = a.table()[0];
    pool.release(a);
    assert_eq!(pool.stats().cached, 1);
    assert_eq!(pool.stats().free, 2);
    let first_events = pool.drain_events();
    assert_eq!(first_events.len(), 1);
    // A second sequence reuses the cached block.
    let b = pool.start(&[1, 2, 9]);
    assert_eq!(b.table(), &[a_first]);
    pool.release(b);
    // Filling the pool with unrelated tokens evicts the cached block and reports it.
    let c = run(&mut pool, &[7, 7, 8, 8, 9]);
    assert_eq!(c.table().len(), 3);
    let events = pool.drain_events();
    assert!(events.contains(&KvEvent::Evicted(match first_events[0] {
        KvEvent::Stored(h) => h,
        other => panic!("{other:?}"),
    })));
    assert_eq!(pool.start(&[1, 2, 9]).cached_tokens(), 0);
}

#[test]
fn reservation_is_all_or_nothing() {
    let mut pool = BlockPool::new(2, 4);
    let mut seq = pool.start(&[1]);
    assert_eq!(pool.reserve(&mut seq, 9), Err(OutOfBlocks { needed: 3, available: 2 }));
    assert_eq!(pool.stats().free, 2);
    pool.reserve(&mut seq, 8).unwrap();
    assert_eq!(pool.available(), 0);
    pool.release(seq);
    assert_eq!(pool.stats().free, 2);
    assert_eq!(pool.stats().used, 0);
}

#[test]
fn decode_appends_one_token_at_a_time() {
    let mut pool = BlockPool::new(4, 2);
    let mut seq = run(&mut pool, &[1, 2, 3]);
    for t in 10..14 {
        if pool.blocks_needed(&seq, 1) > 0 {
            pool.reserve(&mut seq, 1).unwrap();
        } else {
            pool.reserve(&mut seq, 1).unwrap(); // reserving within the last block allocates nothing
        }
        pool.commit(&mut seq, &[t]);
    }
    assert_eq!(seq.len(), 7);
    assert_eq!(seq.table().len(), 4);
    // The generated tokens' full blocks are shareable too.
    pool.release(seq);
    let again = pool.start(&[1, 2, 3, 10, 11, 12, 13, 99]);
    assert_eq!(again.cached_tokens(), 6);
}

#[test]
fn everything_returns_to_the_pool() {
    let mut pool = BlockPool::new(64, 4);
    let mut seqs = Vec::new();
    for i in 0..10u32 {
        let prompt: Vec<u32> = (0..(i * 3 + 5)).map(|t| t % 7 + i % 3).collect();
        seqs.push(run(&mut pool, &prompt));
    }
    for seq in seqs {
        pool.release(seq);
    }
    let s = pool.stats();
    assert_eq!(s.used, 0);
    assert_eq!(s.free + s.cached, s.total);
    assert_eq!(s.fragmentation, 0.0);
}

#[test]
fn a_window_hands_back_the_blocks_no_row_attends_to_and_they_stay_cached() {
    let (bs, window) = (2, 5);
    let mut pool = BlockPool::new(64, bs).unreported();
    let prompt: Vec<u32> = (1..=6).collect();
    let mut seq = pool.start_window(&prompt, None, 0, window);
    pool.reserve(&mut seq, prompt.len()).unwrap();
    pool.commit(&mut seq, &prompt);
    for t in 100..120u32 {
        // The next row (at position len) attends back to len + 1 - window.
        let from = (seq.len() + 1).saturating_sub(window);
        pool.slide(&mut seq, from);
        assert!(seq.held() <= (window + 1).div_ceil(bs) + 1, "{} blocks held at {}", seq.held(), seq.len());
        let first = seq.len() + 1 - window;
        assert!(seq.table()[first / bs] != GONE, "a block the next row reads was handed back");
        assert!(seq.table()[..first / bs].iter().all(|&b| b == GONE));
        pool.reserve(&mut seq, 1).unwrap();
        pool.commit(&mut seq, &[t]);
    }
    assert!(pool.drain_events().is_empty(), "an unreported pool keeps no events");
    let full: Vec<u32> = prompt.iter().copied().chain(100..120).collect();
    let held = seq.held();
    pool.release(seq);
    let s = pool.stats();
    assert_eq!(s.used, 0);
    assert_eq!(s.cached, full.len() / bs, "every full block, handed back early or late, stays cached");
    // Only the first row's window is needed to resume: the blocks before it are not pinned.
    let again = pool.start_window(&full, None, 24, window);
    assert_eq!(again.len(), 24);
    assert_eq!(again.held(), 24 / bs - (24 + 1 - window) / bs);
    assert!(again.held() <= held);
}

#[test]
fn a_window_resumes_only_where_all_of_it_is_still_cached() {
    let (bs, window) = (2, 4);
    let mut pool = BlockPool::new(9, bs).unreported();
    let prompt: Vec<u32> = (1..=12).collect();
    let mut seq = pool.start_window(&prompt, None, 0, window);
    pool.reserve(&mut seq, 12).unwrap();
    pool.commit(&mut seq, &prompt);
    let table = seq.table().to_vec();
    pool.release(seq); // released tail first: block 5 is evicted first, block 0 last
    // Take 4 blocks: the 3 free ones and the least recently used cached one (block 5 of the prompt).
    let mut other = pool.start(&[9]);
    pool.reserve(&mut other, 8).unwrap();
    assert!(!other.table().contains(&table[4]) && other.table().contains(&table[5]));
    // Evict block 4 (next in the cache's order: 4, 3, 2, 1, 0).
    pool.reserve(&mut other, 2).unwrap();
    assert!(other.table().contains(&table[4]) && !other.table().contains(&table[3]));
    // Resuming at 10 would need block 4: the longest resume whose window is whole is 8 (blocks 2 and 3).
    let seq = pool.start_window(&prompt, None, 10, window);
    assert_eq!((seq.len(), seq.held()), (8, 2));
    assert_eq!(&seq.table()[2..], &table[2..4]);
    assert_eq!(&seq.table()[..2], &[GONE; 2], "nothing before the window is pinned");
    pool.release(seq);
    let salted = pool.start_window(&prompt, Some(7), 10, window);
    assert_eq!(salted.len(), 0, "another scope's chain finds nothing");
    pool.release(salted);
    pool.release(other);
    assert_eq!(pool.stats().used, 0);
}

#[test]
fn a_truncated_start_continues_the_chain_from_where_it_was_cut() {
    let mut pool = BlockPool::new(16, 4);
    let prompt: Vec<u32> = (1..=17).collect();
    let first = run(&mut pool, &prompt);
    pool.release(first);
    let mut seq = pool.start_salted(&prompt, None);
    assert_eq!(seq.len(), 16);
    pool.truncate_cached(&mut seq, 8);
    assert_eq!((seq.len(), seq.cached_tokens(), seq.table().len()), (8, 8, 2));
    pool.reserve(&mut seq, 9).unwrap();
    pool.commit(&mut seq, &prompt[8..]);
    pool.release(seq);
    // The recomputed blocks hash as the originals did (same chain): still one cached copy of each.
    assert_eq!(pool.stats().cached, 4);
    let mut again = pool.start(&prompt);
    pool.truncate_cached(&mut again, 0);
    assert_eq!(pool.stats().used, 0);
}

#[test]
fn a_tiered_pool_notes_what_it_evicts_and_what_fills() {
    let mut pool = BlockPool::new(3, 2).tiered();
    let a = run(&mut pool, &[1, 2, 3, 4, 5]);
    let filled = pool.take_filled();
    assert_eq!(filled.len(), 2);
    assert_eq!((filled[0].0, &*filled[0].2), (a.table()[0], &[1, 2][..]));
    assert!(pool.take_filled().is_empty());
    pool.release(a);
    // Three new blocks: the free one, then the two cached ones, tail (3, 4) first.
    let _b = run(&mut pool, &[9, 9, 9, 9, 9]);
    let spilled = pool.take_spilled();
    assert_eq!(spilled.iter().map(|s| &*s.tokens).collect::<Vec<_>>(), vec![&[3, 4][..], &[1, 2][..]]);
    assert_eq!(spilled[1].hash, filled[0].1);
    // An untiered pool notes nothing.
    let mut plain = BlockPool::new(2, 2);
    let c = run(&mut plain, &[1, 2, 3]);
    plain.release(c);
    let _ = run(&mut plain, &[5, 5, 5]);
    assert!(plain.take_spilled().is_empty() && plain.take_filled().is_empty());
}

#[test]
fn a_prefix_continued_in_a_lower_tier_is_restored_as_cached_blocks() {
    use zl_common::block_hash::salted_block_hashes;
    let prompt: Vec<u32> = (1..=9).collect();
    let hashes = salted_block_hashes(&prompt, 2, Some(5));
    let mut pool = BlockPool::new(8, 2).tiered();
    // The lower tier holds the first three blocks of the chain (not the fourth).
    let mut held = |h: BlockHash, _: &[u32]| hashes[..3].contains(&h);
    let mut seq = pool.start_salted(&prompt, Some(5));
    let restored = pool.restore(&mut seq, &prompt, &mut held);
    assert_eq!(restored.iter().map(|r| r.1).collect::<Vec<_>>(), hashes[..3]);
    assert_eq!((seq.len(), seq.cached_tokens(), seq.table().len()), (6, 6, 3));
    let s = pool.stats();
    assert_eq!((s.prefix_lookups, s.prefix_hits), (4, 3), "three hits, then the fourth block missed");
    pool.reserve(&mut seq, 3).unwrap();
    pool.commit(&mut seq, &prompt[6..]);
    pool.release(seq);
    // The restored blocks are indexed like computed ones: the next start finds all four in the pool.
    assert_eq!(pool.start_salted(&prompt, Some(5)).cached_tokens(), 8);
    let stored = pool.drain_events().into_iter().filter(|e| matches!(e, KvEvent::Stored(_))).count();
    assert_eq!(stored, 4);
}

#[test]
fn nothing_is_restored_without_room_for_the_whole_prompt_or_outside_the_scope() {
    use zl_common::block_hash::salted_block_hashes;
    let prompt: Vec<u32> = (1..=9).collect();
    let hashes = salted_block_hashes(&prompt, 2, Some(5));
    let mut held = |h: BlockHash, _: &[u32]| hashes.contains(&h);
    // 4 restored + 1 block for the last token = 5 > 4 blocks.
    let mut small = BlockPool::new(4, 2).tiered();
    let mut seq = small.start_salted(&prompt, Some(5));
    assert!(small.restore(&mut seq, &prompt, &mut held).is_empty());
    assert_eq!(small.stats().used, 0);
    // Another scope's chain has other hashes: nothing of it is held.
    let mut pool = BlockPool::new(8, 2).tiered();
    let mut other = pool.start_salted(&prompt, Some(6));
    assert!(pool.restore(&mut other, &prompt, &mut held).is_empty());
    assert_eq!(other.cached_tokens(), 0);
}

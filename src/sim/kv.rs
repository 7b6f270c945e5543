//! The simulated KV cache of one worker: fixed-size blocks, chained block hashes over full blocks,
//! refcounted active blocks, inactive blocks kept as a prefix cache with LRU eviction, and optional
//! CPU and disk tiers that receive evicted blocks (offload) and give them back on a hit (onboard).
//!
//! Unlike Dynamo's KVBM, which copies every newly computed block from GPU to host memory whether
//! or not it is ever evicted, the simulator offloads a block only when it evicts it: its
//! `kvbm_offload_blocks_d2h` counts evictions into the CPU tier, real KVBM's counts copies.

use std::collections::{BTreeMap, HashMap};

/// Sentinel for "no block" in the intrusive free list.
const NIL: u32 = u32::MAX;

/// Hash of one full block chained to its parent's hash, so equal hashes mean equal prefixes.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    // FNV-1a style mixing with a final avalanche: stable across runs and platforms, which matters
    // because identical prompts from different requests must land on identical hashes.
    let mut h = parent ^ 0x9e37_79b9_7f4a_7c15;
    for &t in tokens {
        h ^= u64::from(t);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

/// Chained hashes of every full block of `tokens`.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut parent = 0u64;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            parent = chain_hash(parent, block);
            parent
        })
        .collect()
}

/// Capacity and bandwidth of an offload tier, in blocks and bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierConfig {
    pub capacity_blocks: u64,
    pub bytes_per_second: f64,
}

/// An LRU set of block hashes held by a tier.
#[derive(Debug, Default)]
struct LruTier {
    config: Option<TierConfig>,
    tick: u64,
    by_hash: HashMap<u64, u64>,
    by_tick: BTreeMap<u64, u64>,
}

impl LruTier {
    fn new(config: Option<TierConfig>) -> Self {
        LruTier {
            config,
            ..LruTier::default()
        }
    }

    fn enabled(&self) -> bool {
        self.config.is_some_and(|c| c.capacity_blocks > 0)
    }

    fn contains(&self, hash: u64) -> bool {
        self.by_hash.contains_key(&hash)
    }

    fn touch(&mut self, hash: u64) {
        if let Some(old) = self.by_hash.get_mut(&hash) {
            self.by_tick.remove(old);
            self.tick += 1;
            *old = self.tick;
            self.by_tick.insert(self.tick, hash);
        }
    }

    /// Inserts `hash`; returns the hash it evicted to make room, if any.
    fn insert(&mut self, hash: u64) -> Option<u64> {
        let capacity = self.config.map_or(0, |c| c.capacity_blocks);
        if capacity == 0 {
            return None;
        }
        if self.contains(hash) {
            self.touch(hash);
            return None;
        }
        let mut evicted = None;
        if self.by_hash.len() as u64 >= capacity
            && let Some((&tick, &old)) = self.by_tick.iter().next()
        {
            self.by_tick.remove(&tick);
            self.by_hash.remove(&old);
            evicted = Some(old);
        }
        self.tick += 1;
        self.by_hash.insert(hash, self.tick);
        self.by_tick.insert(self.tick, hash);
        evicted
    }

    fn len(&self) -> usize {
        self.by_hash.len()
    }

    fn seconds_for(&self, blocks: u64, bytes_per_block: f64) -> f64 {
        match self.config {
            Some(c) if c.bytes_per_second > 0.0 => {
                blocks as f64 * bytes_per_block / c.bytes_per_second
            }
            _ => 0.0,
        }
    }
}

/// A worker's KV counters; `/metrics` exports all but `evicted_blocks`, under vLLM's and Dynamo
/// KVBM's names.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct KvCounters {
    /// Prompt tokens looked up in the prefix cache (vLLM's `prefix_cache_queries`).
    pub prefix_queries_tokens: u64,
    /// Prompt tokens found in the cache (GPU or a lower tier).
    pub prefix_hit_tokens: u64,
    /// Cached GPU blocks whose contents were dropped to make room. Not exported: vLLM has no
    /// eviction counter, and KVBM's offload counters count copies, not evictions.
    pub evicted_blocks: u64,
    /// Evicted GPU blocks offloaded to the CPU tier (KVBM's `offload_blocks_d2h`; a block the
    /// tier already holds is not copied again). The simulator offloads on eviction only, so here
    /// these are evictions into the CPU tier; real KVBM counts every block it copies from GPU to
    /// host, evicted later or not.
    pub offload_d2h_blocks: u64,
    /// Blocks the CPU tier spilled to disk (KVBM's `offload_blocks_h2d`).
    pub offload_h2d_blocks: u64,
    /// Evicted GPU blocks offloaded straight to disk, without a CPU tier (KVBM's
    /// `offload_blocks_d2d`).
    pub offload_d2d_blocks: u64,
    /// Blocks brought back to the GPU from the CPU tier (KVBM's `onboard_blocks_h2d`).
    pub onboard_h2d_blocks: u64,
    /// Blocks brought back to the GPU from disk (KVBM's `onboard_blocks_d2d`).
    pub onboard_d2d_blocks: u64,
    /// Prompt tokens found in the CPU and disk tiers and onboarded instead of recomputed (KVBM's
    /// `matched_tokens`: the external tokens it stages for onboarding).
    pub matched_tokens: u64,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    refs: u32,
    hash: Option<u64>,
    prev: u32,
    next: u32,
    free: bool,
}

/// How much of a block chain each tier already holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Leading blocks resident on the GPU.
    pub gpu: usize,
    /// Following blocks found in the CPU tier.
    pub cpu: usize,
    /// Following blocks found in the disk tier.
    pub disk: usize,
}

impl PrefixMatch {
    pub fn total(&self) -> usize {
        self.gpu + self.cpu + self.disk
    }
}

/// Blocks acquired for a prefix hit, and the transfer time to bring lower-tier blocks back.
#[derive(Debug, Default)]
pub struct Acquired {
    pub blocks: Vec<u32>,
    pub onboard_seconds: f64,
}

/// One worker's KV block pool.
#[derive(Debug)]
pub struct KvCache {
    block_size: usize,
    bytes_per_block: f64,
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    free_count: usize,
    cached: HashMap<u64, u32>,
    cpu: LruTier,
    disk: LruTier,
    counters: KvCounters,
}

impl KvCache {
    pub fn new(
        num_blocks: u32,
        block_size: usize,
        bytes_per_block: f64,
        cpu: Option<TierConfig>,
        disk: Option<TierConfig>,
    ) -> Self {
        let mut cache = KvCache {
            block_size,
            bytes_per_block,
            blocks: Vec::with_capacity(num_blocks as usize),
            head: NIL,
            tail: NIL,
            free_count: 0,
            cached: HashMap::new(),
            cpu: LruTier::new(cpu),
            disk: LruTier::new(disk),
            counters: KvCounters::default(),
        };
        for id in 0..num_blocks {
            cache.blocks.push(Block {
                refs: 0,
                hash: None,
                prev: NIL,
                next: NIL,
                free: false,
            });
            cache.push_free(id);
        }
        cache
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn bytes_per_block(&self) -> f64 {
        self.bytes_per_block
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be handed out now (unreferenced, cached or not).
    pub fn free_blocks(&self) -> usize {
        self.free_count
    }

    /// Blocks referenced by running sequences.
    pub fn active_blocks(&self) -> usize {
        self.blocks.len() - self.free_count
    }

    /// Fraction of blocks referenced by running sequences (`u` of the decode formula).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            0.0
        } else {
            self.active_blocks() as f64 / self.blocks.len() as f64
        }
    }

    /// Blocks whose contents are reusable by hash (active or inactive).
    pub fn cached_blocks(&self) -> usize {
        self.cached.len()
    }

    pub fn cpu_blocks(&self) -> usize {
        self.cpu.len()
    }

    pub fn disk_blocks(&self) -> usize {
        self.disk.len()
    }

    pub fn tiers_enabled(&self) -> bool {
        self.cpu.enabled() || self.disk.enabled()
    }

    pub fn counters(&self) -> KvCounters {
        self.counters
    }

    /// Records a prefix-cache lookup of `query` prompt tokens of which `hit` were found.
    pub fn record_query(&mut self, query: u64, hit: u64) {
        self.counters.prefix_queries_tokens += query;
        self.counters.prefix_hit_tokens += hit;
    }

    /// Counts the leading blocks of `hashes` held by each tier, without changing anything.
    pub fn match_prefix(&self, hashes: &[u64]) -> PrefixMatch {
        let mut m = PrefixMatch {
            gpu: self.overlap_blocks(hashes),
            ..PrefixMatch::default()
        };
        for h in &hashes[m.gpu..] {
            // The disk holds what the CPU tier evicted (older blocks), so a chain may continue from
            // CPU to disk but never back.
            if m.disk == 0 && self.cpu.contains(*h) {
                m.cpu += 1;
            } else if self.disk.contains(*h) {
                m.disk += 1;
            } else {
                break;
            }
        }
        m
    }

    /// Leading blocks of `hashes` resident on the GPU: the router's overlap score.
    pub fn overlap_blocks(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Blocks the free pool gives up to take the matched prefix: inactive GPU hits leave the free
    /// list and every lower-tier hit needs a fresh GPU block.
    pub fn pool_cost(&self, hashes: &[u64], m: PrefixMatch) -> usize {
        let inactive_hits = hashes[..m.gpu]
            .iter()
            .filter(|h| self.blocks[self.cached[*h] as usize].refs == 0)
            .count();
        inactive_hits + m.cpu + m.disk
    }

    /// Takes references on the matched prefix: GPU hits are pinned, lower-tier hits get fresh GPU
    /// blocks (the onboard). Returns `None`, changing nothing, when the free pool is too small.
    pub fn acquire_prefix(&mut self, hashes: &[u64], m: PrefixMatch) -> Option<Acquired> {
        if self.pool_cost(hashes, m) > self.free_count {
            return None;
        }
        let mut blocks = Vec::with_capacity(m.total());
        for h in &hashes[..m.gpu] {
            let id = self.cached[h];
            self.take_ref(id);
            blocks.push(id);
        }
        for (i, h) in hashes[m.gpu..m.total()].iter().enumerate() {
            let id = self.pop_free()?;
            self.take_ref(id);
            self.set_hash(id, *h);
            if i < m.cpu {
                self.cpu.touch(*h);
            } else {
                self.disk.touch(*h);
            }
            blocks.push(id);
        }
        self.counters.onboard_h2d_blocks += m.cpu as u64;
        self.counters.onboard_d2d_blocks += m.disk as u64;
        self.counters.matched_tokens += ((m.cpu + m.disk) * self.block_size) as u64;
        let onboard_seconds = self.cpu.seconds_for(m.cpu as u64, self.bytes_per_block)
            + self.disk.seconds_for(m.disk as u64, self.bytes_per_block);
        Some(Acquired {
            blocks,
            onboard_seconds,
        })
    }

    /// Hands out `n` fresh blocks, evicting the least recently used cached ones; `None` (changing
    /// nothing) when fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free_count {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.pop_free()?;
            self.take_ref(id);
            out.push(id);
        }
        Some(out)
    }

    /// Registers the hash of a block that just became full, so later requests can reuse it.
    pub fn commit_hash(&mut self, id: u32, hash: u64) {
        if self.blocks[id as usize].hash.is_some() || self.cached.contains_key(&hash) {
            // Either already registered, or a duplicate of a resident block: the first copy stays
            // the canonical one, as in vLLM.
            return;
        }
        self.set_hash(id, hash);
    }

    /// Drops one reference on each block. Freed blocks go to the back of the LRU list in reverse
    /// order, so a sequence's tail blocks are evicted before its head blocks (its shared prefix).
    pub fn release(&mut self, blocks: &[u32]) {
        for &id in blocks.iter().rev() {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.refs > 0, "releasing an unreferenced block");
            b.refs = b.refs.saturating_sub(1);
            if b.refs == 0 {
                self.push_free(id);
            }
        }
    }

    fn set_hash(&mut self, id: u32, hash: u64) {
        self.blocks[id as usize].hash = Some(hash);
        self.cached.insert(hash, id);
    }

    fn take_ref(&mut self, id: u32) {
        if self.blocks[id as usize].free {
            self.unlink(id);
        }
        self.blocks[id as usize].refs += 1;
    }

    /// Pops the least recently freed block; if it still holds cached contents they are evicted
    /// (and offloaded to the CPU tier, whose own evictions spill to disk).
    fn pop_free(&mut self) -> Option<u32> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        if let Some(hash) = self.blocks[id as usize].hash.take() {
            if self.cached.get(&hash) == Some(&id) {
                self.cached.remove(&hash);
            }
            self.counters.evicted_blocks += 1;
            self.offload(hash);
        }
        Some(id)
    }

    fn offload(&mut self, hash: u64) {
        if self.cpu.enabled() {
            if !self.cpu.contains(hash) {
                self.counters.offload_d2h_blocks += 1;
            }
            if let Some(spilled) = self.cpu.insert(hash)
                && self.disk.enabled()
            {
                if !self.disk.contains(spilled) {
                    self.counters.offload_h2d_blocks += 1;
                }
                self.disk.insert(spilled);
            }
        } else if self.disk.enabled() {
            // Without a CPU tier, evicted blocks go straight to disk.
            if !self.disk.contains(hash) {
                self.counters.offload_d2d_blocks += 1;
            }
            self.disk.insert(hash);
        }
    }

    fn push_free(&mut self, id: u32) {
        let tail = self.tail;
        {
            let b = &mut self.blocks[id as usize];
            b.free = true;
            b.prev = tail;
            b.next = NIL;
        }
        if tail == NIL {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.free_count += 1;
    }

    fn unlink(&mut self, id: u32) {
        let Block { prev, next, .. } = self.blocks[id as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.free = false;
        b.prev = NIL;
        b.next = NIL;
        self.free_count -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(blocks: u32) -> KvCache {
        KvCache::new(blocks, 4, 1024.0, None, None)
    }

    #[test]
    fn equal_prefixes_share_hashes_and_different_ones_do_not() {
        let a = block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4);
        let b = block_hashes(&[1, 2, 3, 4, 5, 6, 7, 0], 4);
        assert_eq!(a.len(), 2, "only full blocks are hashed");
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        // The chain makes a block's hash depend on everything before it.
        let c = block_hashes(&[0, 2, 3, 4, 5, 6, 7, 8], 4);
        assert_ne!(a[1], c[1]);
    }

    #[test]
    fn released_blocks_stay_cached_until_evicted_tail_first() {
        let mut kv = cache(4);
        let hashes = block_hashes(&(0..12).collect::<Vec<_>>(), 4);
        let blocks = kv.allocate(3).unwrap();
        for (b, h) in blocks.iter().zip(&hashes) {
            kv.commit_hash(*b, *h);
        }
        kv.release(&blocks);
        assert_eq!(kv.free_blocks(), 4);
        assert_eq!(kv.match_prefix(&hashes).gpu, 3);
        // Two fresh blocks: the never-used one first, then the LRU cached one, which is the tail
        // block of the released sequence (freed first).
        kv.allocate(2).unwrap();
        assert_eq!(
            kv.match_prefix(&hashes).gpu,
            2,
            "tail block evicted, head kept"
        );
        assert_eq!(kv.counters().evicted_blocks, 1);
    }

    #[test]
    fn active_blocks_are_never_evicted() {
        let mut kv = cache(2);
        let hashes = block_hashes(&(0..8).collect::<Vec<_>>(), 4);
        let blocks = kv.allocate(2).unwrap();
        kv.commit_hash(blocks[0], hashes[0]);
        assert!(kv.allocate(1).is_none());
        let hit = kv
            .acquire_prefix(&hashes, kv.match_prefix(&hashes))
            .unwrap();
        assert_eq!(
            hit.blocks,
            vec![blocks[0]],
            "a shared block gains a reference"
        );
        kv.release(&blocks);
        assert_eq!(kv.free_blocks(), 1, "still referenced by the second holder");
    }

    /// Caches two blocks of a prompt in a 2-block pool, then takes the pool for a new request,
    /// which evicts both; returns the prompt's block hashes.
    fn cache_two_blocks_then_evict_them(kv: &mut KvCache) -> Vec<u64> {
        let hashes = block_hashes(&(0..8).collect::<Vec<_>>(), 4);
        let blocks = kv.allocate(2).unwrap();
        kv.commit_hash(blocks[0], hashes[0]);
        kv.commit_hash(blocks[1], hashes[1]);
        kv.release(&blocks);
        kv.allocate(2).unwrap();
        hashes
    }

    #[test]
    fn evicted_blocks_offload_to_cpu_then_disk_and_onboard_at_their_cost() {
        let tier = |capacity_blocks| {
            Some(TierConfig {
                capacity_blocks,
                bytes_per_second: 1024.0 * 10.0,
            })
        };
        let mut kv = KvCache::new(2, 4, 1024.0, tier(1), tier(8));
        let hashes = cache_two_blocks_then_evict_them(&mut kv);
        let c = kv.counters();
        assert_eq!(c.offload_d2h_blocks, 2);
        assert_eq!(
            c.offload_h2d_blocks, 1,
            "CPU capacity 1 spills one block to disk"
        );
        assert_eq!((kv.cpu_blocks(), kv.disk_blocks()), (1, 1));
        let m = kv.match_prefix(&hashes);
        assert_eq!(m.gpu, 0);
        assert_eq!(m.total(), 2);
        kv.release(&[0, 1]);
        let got = kv.acquire_prefix(&hashes, m).unwrap();
        assert_eq!(got.blocks.len(), 2);
        assert!(
            (got.onboard_seconds - 0.2).abs() < 1e-9,
            "2 blocks of 1 KiB at 10 KiB/s"
        );
        let c = kv.counters();
        assert_eq!(c.onboard_h2d_blocks + c.onboard_d2d_blocks, 2);
        assert_eq!(c.matched_tokens, 2 * 4, "two onboarded blocks of 4 tokens");
        assert_eq!(
            c.offload_d2d_blocks, 0,
            "the CPU tier takes every GPU eviction"
        );
    }

    #[test]
    fn without_a_cpu_tier_evicted_blocks_go_from_gpu_straight_to_disk() {
        let disk = Some(TierConfig {
            capacity_blocks: 8,
            bytes_per_second: 0.0,
        });
        let mut kv = KvCache::new(2, 4, 1024.0, None, disk);
        cache_two_blocks_then_evict_them(&mut kv);
        let c = kv.counters();
        assert_eq!(
            (
                c.offload_d2h_blocks,
                c.offload_h2d_blocks,
                c.offload_d2d_blocks
            ),
            (0, 0, 2)
        );
        assert_eq!(kv.disk_blocks(), 2);
    }
}

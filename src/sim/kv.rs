//! The KV cache as vLLM V1 keeps it: a fixed pool of blocks of `block_size` tokens, a block
//! table per running sequence, and (with prefix caching) full blocks found again by a hash chain
//! over their tokens' identities.
//!
//! The pool is a pure data structure driven by the engine: no clock, no lock. Free blocks wait in
//! one queue, least recently freed first; a freed block that still carries a hash stays findable
//! until the queue hands it out again (its eviction). Like vLLM, one block is the null block and
//! is never handed out, so `num_gpu_blocks − 1` blocks hold tokens.

use std::collections::HashMap;

/// No block (an end of the free queue, or a block not in it).
const NONE: u32 = u32::MAX;

/// The start of every hash chain (a request's first block has no parent).
const CHAIN_ROOT: u64 = 0x6b76_5f72_6f6f_7421;

/// The hash of a full block of `ids` whose preceding block hashed to `parent`.
pub fn block_hash(parent: u64, ids: impl Iterator<Item = u64>) -> u64 {
    ids.fold(mix(parent ^ 0x9e37_79b9_7f4a_7c15), |h, id| {
        mix(h ^ id.wrapping_mul(0xff51_afd7_ed55_8ccd))
    })
}

/// SplitMix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One sequence's blocks: its block table and how far its full blocks are hashed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqBlocks {
    /// The blocks holding its tokens, in token order.
    pub table: Vec<u32>,
    /// Leading blocks of `table` whose hash is known (registered or found in the cache).
    pub hashed: usize,
    /// The hash of block `hashed − 1` (the chain's parent of the next one).
    pub last_hash: u64,
}

impl Default for SeqBlocks {
    fn default() -> Self {
        SeqBlocks {
            table: Vec::new(),
            hashed: 0,
            last_hash: CHAIN_ROOT,
        }
    }
}

/// What a prefix lookup found for a sequence about to be admitted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    /// The cached blocks, in order (the sequence's first blocks).
    pub blocks: Vec<u32>,
    /// The hash of the last of them.
    pub last_hash: u64,
    /// How many of them are free now (refcount 0): taking them uses up free blocks.
    pub evictable: u64,
}

/// The block pool.
#[derive(Debug)]
pub struct BlockPool {
    block_size: u64,
    caching: bool,
    refcount: Vec<u32>,
    hash: Vec<Option<u64>>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    free: u64,
    cached: HashMap<u64, u32>,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `num_gpu_blocks` blocks of `block_size` tokens (block 0 is the null block).
    pub fn new(num_gpu_blocks: u32, block_size: u32, enable_prefix_caching: bool) -> Self {
        let n = num_gpu_blocks.max(2) as usize;
        let mut p = BlockPool {
            block_size: u64::from(block_size.max(1)),
            caching: enable_prefix_caching,
            refcount: vec![0; n],
            hash: vec![None; n],
            prev: vec![NONE; n],
            next: vec![NONE; n],
            head: NONE,
            tail: NONE,
            free: 0,
            cached: HashMap::new(),
            evictions: 0,
        };
        p.refcount[0] = 1; // the null block
        for b in 1..n as u32 {
            p.push_back(b);
        }
        p
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// True when full blocks are cached and found again.
    pub fn caching(&self) -> bool {
        self.caching
    }

    /// Blocks that can hold tokens (all but the null block).
    pub fn usable(&self) -> u64 {
        self.refcount.len() as u64 - 1
    }

    /// Free blocks, cached ones included (they are handed out when needed).
    pub fn free(&self) -> u64 {
        self.free
    }

    /// Blocks in use by running sequences (`usable − free`).
    pub fn used(&self) -> u64 {
        self.usable() - self.free
    }

    /// Cached blocks evicted so far (handed out again while still carrying a hash).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Blocks findable by their hash now (in use or free).
    pub fn cached_blocks(&self) -> u64 {
        self.cached.len() as u64
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.block_size)
    }

    fn push_back(&mut self, b: u32) {
        let i = b as usize;
        self.prev[i] = self.tail;
        self.next[i] = NONE;
        if self.tail == NONE {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.free += 1;
    }

    fn unlink(&mut self, b: u32) {
        let i = b as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NONE {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NONE {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NONE;
        self.next[i] = NONE;
        self.free -= 1;
    }

    /// The longest run of cached full blocks at the start of the token sequence whose ids
    /// `id_at(i)` gives for `i < tokens`. At most `tokens − 1` tokens are matched, as vLLM
    /// always computes the last prompt token. Nothing is taken yet.
    pub fn lookup(&self, tokens: u64, id_at: impl Fn(u64) -> u64) -> Lookup {
        let mut found = Lookup::default();
        if !self.caching || tokens == 0 {
            return found;
        }
        let bs = self.block_size;
        let max_blocks = (tokens - 1) / bs;
        let mut parent = CHAIN_ROOT;
        for k in 0..max_blocks {
            let h = block_hash(parent, (k * bs..(k + 1) * bs).map(&id_at));
            let Some(&b) = self.cached.get(&h) else {
                break;
            };
            if self.refcount[b as usize] == 0 {
                found.evictable += 1;
            }
            found.blocks.push(b);
            found.last_hash = h;
            parent = h;
        }
        found
    }

    /// Takes the blocks a lookup found: the sequence starts with them, each gains a reference.
    pub fn take(&mut self, found: &Lookup) -> SeqBlocks {
        for &b in &found.blocks {
            if self.refcount[b as usize] == 0 {
                self.unlink(b);
            }
            self.refcount[b as usize] += 1;
        }
        SeqBlocks {
            table: found.blocks.clone(),
            hashed: found.blocks.len(),
            last_hash: if found.blocks.is_empty() {
                CHAIN_ROOT
            } else {
                found.last_hash
            },
        }
    }

    /// Hands out one free block, the least recently freed; a cached one is evicted. `None`
    /// when none is free.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NONE {
            return None;
        }
        self.unlink(b);
        if let Some(h) = self.hash[b as usize].take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
            }
            self.evictions += 1;
        }
        self.refcount[b as usize] = 1;
        Some(b)
    }

    /// Grows `seq` to hold `tokens` tokens; false (and nothing taken) when too few blocks are free.
    pub fn grow_to(&mut self, seq: &mut SeqBlocks, tokens: u64) -> bool {
        let want = self.blocks_for(tokens) as usize;
        let more = want.saturating_sub(seq.table.len());
        if more as u64 > self.free {
            return false;
        }
        for _ in 0..more {
            if let Some(b) = self.allocate() {
                seq.table.push(b);
            }
        }
        true
    }

    /// Registers the full blocks of `seq` among its first `tokens` tokens (ids from `id_at`),
    /// so later sequences with the same tokens find them. A block whose hash another block
    /// already carries stays unregistered (the first stays the one found).
    pub fn register_full(&mut self, seq: &mut SeqBlocks, tokens: u64, id_at: impl Fn(u64) -> u64) {
        if !self.caching {
            return;
        }
        let bs = self.block_size;
        let full = ((tokens / bs) as usize).min(seq.table.len());
        while seq.hashed < full {
            let k = seq.hashed as u64;
            let h = block_hash(seq.last_hash, (k * bs..(k + 1) * bs).map(&id_at));
            let b = seq.table[seq.hashed];
            if self.hash[b as usize].is_none() && !self.cached.contains_key(&h) {
                self.hash[b as usize] = Some(h);
                self.cached.insert(h, b);
            }
            seq.last_hash = h;
            seq.hashed += 1;
        }
    }

    /// Gives back the blocks of `seq`: each loses a reference; a block nobody holds goes to
    /// the free queue's end, the sequence's last block first (so it is evicted before the
    /// earlier ones, which more sequences share). Without prefix caching its hash is dropped.
    pub fn release(&mut self, seq: &mut SeqBlocks) {
        for &b in seq.table.iter().rev() {
            let i = b as usize;
            self.refcount[i] -= 1;
            if self.refcount[i] == 0 {
                if !self.caching {
                    self.hash[i] = None;
                }
                self.push_back(b);
            }
        }
        seq.table.clear();
        seq.hashed = 0;
        seq.last_hash = CHAIN_ROOT;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(seed: u64) -> impl Fn(u64) -> u64 {
        move |i| seed * 1_000_003 + i
    }

    #[test]
    fn allocation_uses_all_but_the_null_block() {
        let mut p = BlockPool::new(5, 4, false);
        assert_eq!(p.usable(), 4);
        let mut s = SeqBlocks::default();
        assert!(p.grow_to(&mut s, 16));
        assert_eq!(s.table.len(), 4);
        assert_eq!(p.free(), 0);
        assert!(!p.grow_to(&mut s, 17), "no fifth block");
        assert_eq!(s.table.len(), 4, "a failed growth takes nothing");
        p.release(&mut s);
        assert_eq!(p.free(), 4);
    }

    #[test]
    fn full_blocks_are_found_again_but_never_the_last_token() {
        let mut p = BlockPool::new(64, 4, true);
        let mut a = SeqBlocks::default();
        assert!(p.grow_to(&mut a, 10));
        p.register_full(&mut a, 10, ids(1));
        assert_eq!(a.hashed, 2, "two full blocks of 10 tokens");
        p.release(&mut a);
        // The same 10 tokens: at most 9 may be matched, so 2 blocks (8 tokens).
        assert_eq!(p.lookup(10, ids(1)).blocks.len(), 2);
        // 8 tokens exactly: the last token is computed, so only one block matches.
        assert_eq!(p.lookup(8, ids(1)).blocks.len(), 1);
        // Other tokens: nothing.
        assert!(p.lookup(10, ids(2)).blocks.is_empty());
        let f = p.lookup(12, ids(1));
        assert_eq!(f.evictable, 2, "both are free, cached");
        let free = p.free();
        let s = p.take(&f);
        assert_eq!(p.free(), free - 2);
        assert_eq!(s.hashed, 2);
    }

    #[test]
    fn least_recently_freed_cached_blocks_are_evicted_first() {
        let mut p = BlockPool::new(5, 4, true);
        let (mut a, mut b) = (SeqBlocks::default(), SeqBlocks::default());
        assert!(p.grow_to(&mut a, 8));
        p.register_full(&mut a, 8, ids(1));
        assert!(p.grow_to(&mut b, 8));
        p.register_full(&mut b, 8, ids(2));
        p.release(&mut a);
        p.release(&mut b);
        assert_eq!(p.cached_blocks(), 4);
        // Two new blocks evict a's two (freed first), b's stay findable.
        let mut c = SeqBlocks::default();
        assert!(p.grow_to(&mut c, 8));
        assert_eq!(p.evictions(), 2);
        assert!(p.lookup(9, ids(1)).blocks.is_empty());
        assert_eq!(p.lookup(9, ids(2)).blocks.len(), 2);
    }

    #[test]
    fn a_shared_block_is_held_once() {
        let mut p = BlockPool::new(9, 4, true);
        let mut a = SeqBlocks::default();
        assert!(p.grow_to(&mut a, 9));
        p.register_full(&mut a, 9, ids(7));
        let f = p.lookup(9, ids(7));
        assert_eq!((f.blocks.len(), f.evictable), (2, 0), "held by a, not free");
        let mut b = p.take(&f);
        assert!(p.grow_to(&mut b, 9));
        assert_eq!(p.used(), 4, "a: 3 blocks, b: 1 of its own");
        p.release(&mut a);
        assert_eq!(p.used(), 3, "b still holds the two shared blocks");
    }
}

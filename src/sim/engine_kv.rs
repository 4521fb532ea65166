//! How the engine's requests take, grow and give back KV blocks: admission when the prompt's
//! blocks (less its prefix-cache hits) fit, one more block whenever the token a step computes
//! starts one, preemption of the most recently admitted request when none is free (vLLM V1's
//! recompute mode), and the block truth published at each step boundary.
//!
//! Room is made as vLLM V1's scheduler makes it (`allocate_slots` for the step's
//! `num_new_tokens`): a step computes the keys and values of the tokens its sequences already
//! have (the prompt at admission, the last generated token in decode), so a sequence of
//! `prompt + generated` tokens holds `ceil((prompt + generated) / block_size)` blocks while the
//! step runs. The token the step samples gets its slot when the next step is scheduled.

use std::sync::atomic::Ordering::Relaxed;

use super::engine::{secs, Active, Engine, Sink};
use super::kv::{BlockPool, Lookup};
use super::metrics::RequestKv;
use super::prompt::generated_id;

/// The identity of token `i` of a sequence whose prompt has identities `ids`: the prompt's,
/// then its generated tokens' as the next prompt will read them.
fn id_at(ids: &[u64]) -> impl Fn(u64) -> u64 + '_ {
    let p = ids.len() as u64;
    move |i| {
        if i < p {
            ids[i as usize]
        } else {
            generated_id(i - p)
        }
    }
}

/// True when the request's prompt identities are known (one per prompt token).
fn known<S>(a: &Active<S>) -> bool {
    a.job.prompt_ids.len() as u64 == a.job.prompt_tokens
}

impl<S> Active<S> {
    /// Registers the blocks choice `c` has filled (its tokens so far), so later prompts that
    /// start with the same tokens find them.
    pub(super) fn register_filled(&mut self, pool: &mut BlockPool, c: usize) {
        if !pool.caching() || !known(self) {
            return;
        }
        let tokens = self.job.prompt_tokens + self.generated[c];
        let ids = &self.job.prompt_ids;
        pool.register_full(&mut self.blocks[c], tokens, id_at(ids));
    }
}

impl<S: Sink> Engine<S> {
    /// Blocks running request `i` needs beyond those it holds, for the token each of its live
    /// sequences feeds to the coming step (its last generated one).
    fn growth_need(&self, i: usize) -> u64 {
        let a = &self.running[i];
        let p = a.job.prompt_tokens;
        (0..a.generated.len())
            .filter(|c| !a.done[*c])
            .map(|c| {
                let want = self.pool.blocks_for(p + a.generated[c]);
                want.saturating_sub(a.blocks[c].table.len() as u64)
            })
            .sum()
    }

    /// Gives every running sequence a block for the token it feeds to the step where it needs
    /// one. When none is
    /// free, the most recently admitted request is preempted (blocks freed, back to the front of
    /// the queue, to be computed again when admitted), until the need fits or the request
    /// itself was the one preempted. Returns the number of preemptions.
    pub(super) fn make_room(&mut self) -> u64 {
        let mut preempted = 0;
        let mut i = 0;
        while i < self.running.len() {
            while self.growth_need(i) > self.pool.free() {
                let Some(mut victim) = self.running.pop() else {
                    break;
                };
                let was_self = self.running.len() == i;
                self.release_all(&mut victim);
                victim.preemptions += 1;
                preempted += 1;
                // Pushed to the front in the order popped: the oldest preempted ends first.
                self.waiting.push_front(victim);
                if was_self {
                    break;
                }
            }
            if let Some(a) = self.running.get_mut(i) {
                let p = a.job.prompt_tokens;
                for c in 0..a.generated.len() {
                    if !a.done[c] {
                        self.pool.grow_to(&mut a.blocks[c], p + a.generated[c]);
                    }
                }
            }
            i += 1;
        }
        if preempted > 0 {
            self.stats.preemptions.fetch_add(preempted, Relaxed);
        }
        preempted
    }

    /// Gives back every block of `a` and its slots in the batch.
    pub(super) fn release_all(&mut self, a: &mut Active<S>) {
        for b in a.blocks.iter_mut() {
            self.pool.release(b);
        }
        self.running_seqs -= u64::from(a.live_seqs);
    }

    /// Admits the request at the front of the queue when its blocks fit: its cached prefix is
    /// taken, blocks for the rest of its tokens (the prompt, and what a preempted request had
    /// generated: all are computed again) allocated. Returns the
    /// tokens its prefill computes (the longest of its sequences'), or `None` (it stays first).
    ///
    /// A request never admitted before counts its prompt in `prefix_cache_queries` and what was
    /// found in `prefix_cache_hits` at every attempt, as vLLM does; a preempted one does not.
    pub(super) fn try_admit(&mut self, now_ns: u64) -> Option<u64> {
        let front = self.waiting.front()?;
        let p = front.job.prompt_tokens;
        let bs = self.pool.block_size();
        let known = known(front) && self.pool.caching();
        let live: Vec<usize> = (0..front.generated.len())
            .filter(|c| !front.done[*c])
            .collect();
        let c0 = *live.first()?;
        let found = if known {
            self.pool
                .lookup(p + front.generated[c0], id_at(&front.job.prompt_ids))
        } else {
            Lookup::default()
        };
        let hit_tokens = found.blocks.len() as u64 * bs;
        let first_time = front.admitted_ns.is_none();
        if first_time && self.pool.caching() {
            self.stats.prefix_cache_queries.fetch_add(p, Relaxed);
            self.stats
                .prefix_cache_hits
                .fetch_add(hit_tokens.min(p), Relaxed);
        }
        // Every sequence but the first is counted without hits: never more than it takes.
        let need: u64 = live
            .iter()
            .map(|c| self.pool.blocks_for(p + front.generated[*c]))
            .sum::<u64>()
            - found.blocks.len() as u64
            + found.evictable;
        if need > self.pool.free() {
            return None;
        }
        let mut a = self.waiting.pop_front()?;
        let mut computed = 0u64;
        for &c in &live {
            let tokens = p + a.generated[c];
            let f = if c == c0 {
                found.clone()
            } else if known {
                self.pool.lookup(tokens, id_at(&a.job.prompt_ids))
            } else {
                Lookup::default()
            };
            a.blocks[c] = self.pool.take(&f);
            self.pool.grow_to(&mut a.blocks[c], tokens);
            computed = computed.max(tokens - f.blocks.len() as u64 * bs);
            if known {
                let ids = &a.job.prompt_ids;
                self.pool
                    .register_full(&mut a.blocks[c], tokens, id_at(ids));
            }
        }
        if first_time {
            a.admitted_ns = Some(now_ns);
            a.last_token_ns = now_ns;
            a.cached_tokens = hit_tokens.min(p);
            self.stats
                .prompt_tokens_cached
                .fetch_add(a.cached_tokens, Relaxed);
            self.stats
                .lock()
                .queue
                .observe_n(secs(now_ns.saturating_sub(a.job.arrival_ns)), 1);
        }
        self.running_seqs += u64::from(a.live_seqs);
        self.running.push(a);
        Some(computed)
    }

    /// Publishes the block truth: per running request (finished ones left out) and in total.
    pub(super) fn publish_kv(&self) {
        let s = &self.stats;
        let mut held = 0u64;
        let mut l = s.lock();
        l.kv_requests.clear();
        for a in self.running.iter().filter(|a| a.timings_pending()) {
            let p = a.job.prompt_tokens;
            // The block tables themselves: shared prefix blocks count once per sequence here,
            // once in `used` below.
            let blocks: u64 = (0..a.generated.len())
                .filter(|c| !a.done[*c])
                .map(|c| a.blocks[c].table.len() as u64)
                .sum();
            held += blocks;
            l.kv_requests.push(RequestKv {
                id: a.id,
                prompt_tokens: p,
                generated_tokens: a.generated.iter().sum(),
                blocks,
                cached_tokens: a.cached_tokens,
                preemptions: a.preemptions,
            });
        }
        // Stored under the lock, so a reader holding it sees totals and list of one moment.
        s.kv_blocks_held.store(held, Relaxed);
        s.kv_blocks_used.store(self.pool.used(), Relaxed);
        s.kv_cached_blocks.store(self.pool.cached_blocks(), Relaxed);
        s.kv_evictions.store(self.pool.evictions(), Relaxed);
        drop(l);
    }
}

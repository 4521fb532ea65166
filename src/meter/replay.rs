//! Rebuilding the per-second timeline from finished records (an access log), for `analyze`.

use std::collections::BTreeMap;

use crate::clock::UnixNanos;
use crate::record::RequestRecord;

use super::capacity::{capacity_curve, CapacityRow, RequestLevel};
use super::timeline::{
    attribute_record, end_ns, mean_level, second_of, InFlightIntegrator, SecondBucket,
};

/// Seconds rebuilt from records, plus what the capacity curve needs about each request.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// Every second something happened in (absent seconds were idle: level 0, no tokens).
    pub seconds: BTreeMap<u64, SecondBucket>,
    /// One entry per generation record, in order of finish.
    pub requests: Vec<RequestLevel>,
}

impl Timeline {
    /// Replays generation records (others are skipped): in-flight from `[start, end]` of each,
    /// tokens by the replay attribution rules, finished-request stats in the end second.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a RequestRecord>) -> Timeline {
        let records: Vec<&RequestRecord> =
            records.into_iter().filter(|r| r.is_generation()).collect();
        // (time, is_start, index): ends sort before starts at the same instant.
        let mut events: Vec<(UnixNanos, bool, usize)> = Vec::with_capacity(records.len() * 2);
        for (i, r) in records.iter().enumerate() {
            events.push((r.start_ns(), true, i));
            events.push((end_ns(r), false, i));
        }
        events.sort_unstable();
        let mut tl = Timeline::default();
        let mut area_start = vec![0u128; records.len()];
        let mut integrator = InFlightIntegrator::new();
        for (t, is_start, i) in events {
            let seconds = &mut tl.seconds;
            let delta = if is_start { 1 } else { -1 };
            integrator.change(t, delta, 0, &mut |sec, level, ns| {
                seconds.entry(sec).or_default().observe_level(level, ns)
            });
            if is_start {
                area_start[i] = integrator.area_ns();
            } else {
                let r = records[i];
                let mean = mean_level(
                    area_start[i],
                    integrator.area_ns(),
                    r.start_ns(),
                    t,
                    r.in_flight_at_start,
                );
                tl.requests.push(RequestLevel {
                    level: mean.round() as u32,
                    tok_s: r.tok_s,
                    ttft_ms: r.ttft_ms,
                    in_flight_at_start: r.in_flight_at_start,
                    cold_start: r.cold_start,
                });
            }
        }
        for r in &records {
            tl.seconds
                .entry(second_of(r.start_ns()))
                .or_default()
                .requests_started += 1;
            tl.seconds
                .entry(second_of(end_ns(r)))
                .or_default()
                .add_finished(r);
            let seconds = &mut tl.seconds;
            attribute_record(r, &mut |sec, gen, prompt| {
                let b = seconds.entry(sec).or_default();
                b.gen_tokens += gen;
                b.prompt_tokens += prompt;
            });
        }
        tl
    }

    /// The capacity curve of the replayed timeline.
    pub fn capacity(&self) -> Vec<CapacityRow> {
        capacity_curve(self.seconds.values(), &self.requests)
    }
}

// ---- KV cache: the live table, the headroom, the saturation state (docs/kv-cache.md) ----
// Every figure is /stats' kv object or the window's saturation object as it is.

const SATURATION_NAMES = ["ok", "queueing", "preempting"];

function renderKv(s, w) {
  const kv = s.kv;
  const c = kv.cache;
  setText("kv_cache", c
    ? (c.num_gpu_blocks === null ? "–" : c.num_gpu_blocks) + " blocks of " +
      (c.block_size === null ? "–" : c.block_size) + " tokens (" +
      (c.kv_cache_size_tokens === null ? "–" : c.kv_cache_size_tokens) + " tokens; counted by " + c.basis + ")"
    : "unknown: " + kv.cache_reason);
  const body = $("kv_table").tBodies[0];
  kv.table.forEach((r, i) => {
    const tr = body.rows[i] || body.insertRow();
    while (tr.cells.length < 6) tr.insertCell();
    tr.id = "kv-" + r.percentile;
    [r.percentile, int(r.context_tokens), int(r.kv_sequences), int(r.service_level_in_flight),
      int(r.max_num_seqs), r.binds_first === null ? "–" : r.binds_first.replace(/_/g, " ")]
      .forEach((t, j) => { if (tr.cells[j].textContent !== t) tr.cells[j].textContent = t; });
  });
  while (body.rows.length > kv.table.length) body.deleteRow(-1);
  const h = kv.headroom, e = kv.estimate;
  kvRows("kv_headroom", [
    ["sequences_p90", "sequences of the p90 context that still fit", int(h.sequences_p90),
      h.sequences_p90 === 0 ? "bad" : ""],
    ["seconds_to_full", "seconds to full at the current growth",
      h.seconds_to_full === null ? (h.growth_blocks_per_s === null ? "–" : "not filling") : num(h.seconds_to_full, 1),
      h.seconds_to_full !== null && h.seconds_to_full < 120 ? "bad" : ""],
    ["growth", "growth, blocks/s (shortest window)", num(h.growth_blocks_per_s, 2)],
    ["used_fraction", "blocks in use, %", h.used_fraction === null ? "–" : num(100 * h.used_fraction, 1),
      h.warning ? "bad" : ""],
    ["blocks", "blocks held by the proxy's in-flight requests", int(e.blocks)],
    ["server_blocks", "blocks in use by vLLM's count", num(e.server_blocks, 1)],
    ["diff_blocks", "vLLM − proxy, blocks", num(e.diff_blocks, 1)],
  ]);
  setText("kv_note", h.reason || (h.warning ? "above " + h.threshold_pct + " % of the blocks" : ""));
  const sat = w && w.saturation;
  const st = sat ? sat.state : null;
  setText("saturation", st === null ? "unknown" : st);
  $("saturation").className = "value " + (st === "preempting" || st === "queueing" ? "bad" : st === "ok" ? "okc" : "");
  let note = "";
  if (sat && st !== null && sat.source === "scrape") {
    note = "from vLLM's gauges: waiting in " + num(100 * sat.waiting_share, 0) + " % of " + sat.samples +
      " scrapes, " + num(sat.preemptions, 0) + " preemptions";
  } else if (sat && st !== null) {
    const f = sat.first_token;
    note = "from first tokens: " + f.queued + " of " + f.judged + " queued; queueing share of TTFT " +
      num(100 * f.ttft_queueing_share, 0) + " %";
  } else if (sat) {
    note = sat.reason;
  }
  setText("saturation_note", note);
}

// Runs of seconds whose state was queueing or preempting, as a band along the top of the
// timeline (/stats/timeline's saturation column).
function saturationBands(svg, t, xOf, f) {
  const sat = t.saturation || [];
  let marked = 0;
  for (let i = 0; i < sat.length; ) {
    const v = sat[i];
    if (!(v >= 1)) { i++; continue; }
    let j = i;
    while (j < sat.length && sat[j] === v) j++;
    const xa = xOf(t.from_s + i), xb = xOf(t.from_s + j);
    svg.appendChild(el("rect", { class: "sat" + v, x: xa, y: f.y1, width: Math.max(1, xb - xa), height: 8 }));
    marked += j - i;
    i = j;
  }
  svg.dataset.saturatedSeconds = String(marked);
}

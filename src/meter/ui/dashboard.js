"use strict";
// The live dashboard: polls /stats (one window) and /stats/timeline every second and redraws in
// place. Every number comes from those documents as they are; the page derives only the share
// column and the window's time axis. The capacity answer is /stats' service_level, shown as it
// is: the page draws no conclusion of its own (no knee from a level with a second of data).

const POLL_MS = 1000;
const PAGE_ROWS = 20;
const TIMELINE_S = 300;
const SVG_NS = "http://www.w3.org/2000/svg";
// Outcomes that are errors of the box (the server or the proxy failed): the only ones shown in
// red. client_aborted (a client that gave up, load's own deadline included) and client_error (its
// request refused) are the client's doing. A unit test (meter::ui) holds this list to Outcome::is_error.
const BOX_ERRORS = ["upstream_error", "upstream_aborted", "timeout", "proxy_error"];

const token = new URLSearchParams(location.hash.slice(1)).get("token");
const state = { window: null, page: 0, filter: "", snap: null, timeline: null, updates: 0 };
const $ = (id) => document.getElementById(id);

// ---- formatting: one place, so the test knows the rounding ----
function num(v, digits) {
  if (v === null || v === undefined || !isFinite(v)) return "–";
  return Number(v).toFixed(digits);
}
function int(v) {
  if (v === null || v === undefined) return "–";
  return String(Math.round(v));
}
function dur(s) {
  if (s < 120) return s.toFixed(0) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function setText(id, text) {
  const el = $(id);
  if (el && el.textContent !== text) el.textContent = text;
}

// ---- fetching ----
async function getJson(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const r = await fetch(path, { headers, cache: "no-store" });
  const body = await r.text();
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { msg += ": " + JSON.parse(body).error.message; } catch (_) { /* not JSON */ }
    throw new Error(msg);
  }
  return JSON.parse(body);
}

async function poll() {
  const t0 = performance.now();
  try {
    const q = state.window ? "?window=" + encodeURIComponent(state.window) : "";
    const [snap, timeline] = await Promise.all([
      getJson("/stats" + q),
      getJson("/stats/timeline?seconds=" + TIMELINE_S),
    ]);
    state.snap = snap;
    state.timeline = timeline;
    render();
    state.updates += 1;
    const ms = performance.now() - t0;
    document.body.dataset.uptimeS = String(snap.uptime_s);
    document.body.dataset.window = state.window;
    document.body.dataset.updateMs = ms.toFixed(1);
    document.body.dataset.updates = String(state.updates);
    const st = $("status");
    st.className = "status";
    st.textContent = "updated " + new Date().toLocaleTimeString() + " · fetch + draw " +
      ms.toFixed(0) + " ms · every " + POLL_MS / 1000 + " s";
  } catch (e) {
    const st = $("status");
    st.className = "status bad";
    st.textContent = "cannot read /stats: " + e.message + " (retrying)";
  }
  setTimeout(poll, POLL_MS);
}

// ---- rendering ----
function render() {
  const s = state.snap;
  const names = Object.keys(s.windows);
  if (!state.window) {
    // First answer: all windows. Pick 60 s when configured (holds scrape samples), else the first.
    state.window = names.includes("60s") ? "60s" : names[0];
    const sel = $("window");
    for (const n of names) {
      const o = document.createElement("option");
      o.value = n;
      o.textContent = n;
      sel.appendChild(o);
    }
    sel.value = state.window;
  }
  const w = s.windows[state.window] || null;
  setText("upstream", s.upstream);
  setText("uptime", dur(s.uptime_s));
  renderTiles(s, w);
  renderTimeline(state.timeline);
  renderPercentiles(w);
  renderServer(s, w);
  renderKv(s, w);
  renderServiceLevel(s.service_level);
  renderCapacity(s.capacity);
  renderUsers(s, w);
  renderSessions(s.sessions);
  renderHealth(s);
}

// ---- agent sessions: /stats' top sessions by wait, then the rest summed ----
function renderSessions(v) {
  setText("sessions_sub", v.active + " active (a call in the last " + v.active_window_s + " s), " +
    v.seen + " seen; the top " + v.top.length + " by time waited on the model");
  const rows = v.top.map((r) => ["sess-" + r.session, [r.session, r.user, int(r.calls),
    r.turns === null ? "–" : String(r.turns), num(r.wait_ms / 1000, 2), num(r.between_ms / 1000, 2),
    r.prompt_tokens + " / " + r.completion_tokens, num(r.context_growth_per_call, 0),
    r.cached_tokens === null ? "–" : String(r.cached_tokens), String(r.prefix_lost_tokens),
    num(r.slowest_wait_ms, 0), num(r.idle_s, 0)]]);
  const o = v.other;
  if (o.sessions > 0) {
    rows.push(["sess-other", ["other (" + o.sessions + " sessions)", "", int(o.calls), "",
      num(o.wait_ms / 1000, 2), num(o.between_ms / 1000, 2), o.prompt_tokens + " / " + o.completion_tokens,
      "", o.cached_tokens === null ? "–" : String(o.cached_tokens), String(o.prefix_lost_tokens), "", ""]]);
  }
  const body = $("sessions").tBodies[0];
  while (body.rows.length > rows.length) body.deleteRow(-1);
  rows.forEach(([id, vals], i) => {
    const tr = body.rows[i] || body.insertRow();
    while (tr.cells.length < 12) tr.insertCell();
    tr.id = id;
    vals.forEach((t, j) => {
      if (tr.cells[j].textContent !== t) tr.cells[j].textContent = t;
    });
  });
}

function renderTiles(s, w) {
  setText("gen_tok_s", num(w && w.gen_tok_s, 1));
  setText("prompt_tok_s", num(w && w.prompt_tok_s, 1));
  setText("gen_note", w ? "over the last " + w.seconds + " complete s" : "");
  setText("in_flight", int(s.in_flight));
  const inf = w && w.in_flight;
  setText("in_flight_mean", inf ? num(inf.mean, 2) : "–");
  setText("in_flight_range", inf ? "min " + inf.min + ", max " + inf.max : "–");
  setText("steady", w && w.steady ? "yes, N = " + inf.min : "no");
  $("steady").className = "value " + (w && w.steady ? "okc" : "");
  setText("requests_finished", int(w && w.requests_finished));
  setText("requests_started", int(w && w.requests_started));
  setText("errors", int(w && w.errors));
  $("errors").className = w && w.errors > 0 ? "bad" : "";
  setText("errors_total", int(s.totals.errors));
  setText("client_errors", int(w && w.client_errors));
}

const PCT_ROWS = [
  ["ttft_ms", "TTFT (time to first token), ms"],
  ["tpot_ms", "TPOT (time per output token), ms"],
  ["itl_ms", "ITL (inter-token latency), ms"],
  ["e2e_ms", "e2e (request latency), ms"],
];

function renderPercentiles(w) {
  const body = $("pct").tBodies[0];
  const known = new Set(PCT_ROWS.map((r) => r[0]));
  const rows = PCT_ROWS.slice();
  // Percentile objects the page does not name yet still show, under their field name.
  if (w) {
    for (const [k, v] of Object.entries(w)) {
      if (!known.has(k) && v && typeof v === "object" && "p50" in v && "p90" in v) rows.push([k, k]);
    }
  }
  for (const [key, label] of rows) {
    let tr = document.getElementById("pct-" + key);
    if (!tr) {
      tr = body.insertRow();
      tr.id = "pct-" + key;
      tr.insertCell().textContent = label;
      for (let i = 0; i < 3; i++) tr.insertCell();
    }
    const p = w ? w[key] : undefined;
    const cells = tr.cells;
    if (p === undefined) {
      cells[1].textContent = "not measured";
      cells[2].textContent = cells[3].textContent = "";
    } else {
      cells[1].textContent = num(p && p.p50, 1);
      cells[2].textContent = num(p && p.p90, 1);
      cells[3].textContent = num(p && p.p99, 1);
    }
  }
  setText("pct_note", w ? "over requests finished in the last " + w.seconds + " s; – = none finished" : "");
}

function kvRows(tableId, rows) {
  const body = $(tableId).tBodies[0];
  while (body.rows.length > rows.length) body.deleteRow(-1);
  rows.forEach(([key, label, value, cls], i) => {
    let tr = body.rows[i];
    if (!tr) {
      tr = body.insertRow();
      tr.insertCell();
      tr.insertCell();
    }
    tr.id = tableId + "-" + key;
    if (tr.cells[0].textContent !== label) tr.cells[0].textContent = label;
    if (tr.cells[1].textContent !== value) tr.cells[1].textContent = value;
    tr.cells[1].className = cls || "";
  });
}

function renderServer(s, w) {
  const sv = w && w.server;
  const sc = s.server_scrape;
  if (!sc) {
    kvRows("server", [["off", "scraping", "off: set upstream_metrics_url to compare with vLLM's /metrics"]]);
    setText("server_note", "");
    return;
  }
  const mm = (m) => (m ? m.min + " – " + m.max : "–");
  const dis = sv && sv.disagreement;
  kvRows("server", [
    ["gen_tok_s", "vLLM generation tok/s", num(sv && sv.gen_tok_s, 1)],
    ["proxy_gen_tok_s", "proxy generation tok/s, same interval", num(sv && sv.proxy_gen_tok_s, 1)],
    ["disagreement_pct", "difference, %", num(sv && sv.disagreement_pct, 2),
      dis ? "bad" : dis === false ? "okc" : ""],
    ["disagreement", "disagreement flagged", dis === null || dis === undefined ? "–" : dis ? "YES" : "no",
      dis ? "bad" : ""],
    ["running", "vLLM running (min – max)", mm(sv && sv.running)],
    ["waiting", "vLLM waiting (min – max)", mm(sv && sv.waiting)],
    ["in_flight_diff", "proxy in flight − vLLM running+waiting", num(sv && sv.in_flight_diff, 2)],
    ["kv_cache_usage", "KV cache usage, %", sv && sv.kv_cache_usage !== null ? num(100 * sv.kv_cache_usage, 1) : "–"],
    ["interval", "compared interval, s (samples)",
      sv ? num(sv.interval_s, 1) + " (" + sv.samples + ")" : "–"],
    ["scrapes", "scrapes ok / failed", sc.ok + " / " + sc.errors, sc.errors > 0 ? "bad" : ""],
    ["last_error", "last scrape error", sc.last_error || "none"],
  ]);
  setText("server_note", "scraping " + sc.url + " every " + sc.interval_s + " s");
}

function renderHealth(s) {
  const o = s.totals.outcomes;
  const rows = [["errors", "errors of the server (upstream or proxy)", String(s.totals.errors), s.totals.errors ? "bad" : ""]];
  for (const [k, v] of Object.entries(o)) {
    const box = BOX_ERRORS.includes(k);
    const whose = k === "ok" ? "" : box ? " (server)" : " (the client's own)";
    rows.push(["outcome-" + k, "outcome " + k + whose, String(v), v && box ? "bad" : ""]);
  }
  const al = s.access_log;
  rows.push(["written", "access log: lines written", String(al.written)]);
  rows.push(["dropped", "access log: dropped (queue full)", String(al.dropped), al.dropped ? "bad" : ""]);
  rows.push(["failed", "access log: lost to write errors", String(al.failed), al.failed ? "bad" : ""]);
  rows.push(["users_folded", "requests folded into \"other\" (user cap)", String(s.users_folded)]);
  rows.push(["cold_starts", "cold starts (first request after idle)", String(s.totals.cold_starts)]);
  kvRows("health", rows);
}

// ---- users: top-N by tok/s, paged; a fixed pool of rows is updated in place ----
function renderUsers(s, w) {
  const agg = w && w.gen_tok_s;
  let list = Object.entries(s.users).map(([name, u]) => {
    const uw = u.windows[state.window] || null;
    return { name, u, uw, rate: uw && uw.gen_tok_s !== null ? uw.gen_tok_s : -1 };
  });
  const total = list.length;
  if (state.filter) list = list.filter((x) => x.name.includes(state.filter));
  list.sort((a, b) => b.rate - a.rate || (a.name < b.name ? -1 : 1));
  const pages = Math.max(1, Math.ceil(list.length / PAGE_ROWS));
  state.page = Math.min(state.page, pages - 1);
  const first = state.page * PAGE_ROWS;
  const shown = list.slice(first, first + PAGE_ROWS);
  setText("page", "page " + (state.page + 1) + " of " + pages);
  setText("users_sub", total + " users in the live view, ordered by tok/s over " + state.window +
    (state.filter ? "; " + list.length + " match" : ""));
  const body = $("users").tBodies[0];
  while (body.rows.length < PAGE_ROWS) {
    const tr = body.insertRow();
    for (let i = 0; i < 8; i++) tr.insertCell();
  }
  for (let i = 0; i < PAGE_ROWS; i++) {
    const tr = body.rows[i];
    const x = shown[i];
    tr.hidden = !x;
    if (!x) continue;
    const uw = x.uw;
    const share = agg && uw && uw.gen_tok_s !== null ? (100 * uw.gen_tok_s) / agg : null;
    const vals = [
      String(first + i + 1),
      x.name,
      num(uw && uw.gen_tok_s, 1),
      share === null ? "–" : num(share, 1) + " %",
      int(uw && uw.requests_finished),
      num(uw && uw.ttft_ms && uw.ttft_ms.p50, 1),
      num(uw && uw.ttft_ms && uw.ttft_ms.p90, 1),
      String(x.u.in_flight),
    ];
    tr.dataset.user = x.name;
    vals.forEach((v, j) => {
      if (tr.cells[j].textContent !== v) tr.cells[j].textContent = v;
    });
  }
}

// ---- SVG drawing ----
function el(name, attrs, text) {
  const e = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Ticks at 1, 2 or 5 x 10^k covering [0, max].
function niceTicks(max, count) {
  if (!(max > 0)) max = 1;
  const raw = max / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const top = Math.ceil(max / step) * step;
  const ticks = [];
  for (let v = 0; v <= top + step / 2; v += step) ticks.push(+v.toPrecision(10));
  return { top, ticks };
}

function frame(svg, w, h, m, xTicks, xLabel, left, leftLabel, right, rightLabel) {
  const x0 = m.l, x1 = w - m.r, y0 = h - m.b, y1 = m.t;
  for (const [v, label] of xTicks) {
    svg.appendChild(el("line", { class: "grid", x1: v, x2: v, y1: y1, y2: y0 }));
    svg.appendChild(el("text", { x: v, y: y0 + 14, "text-anchor": "middle" }, label));
  }
  for (const t of left.ticks) {
    const y = y0 - ((y0 - y1) * t) / left.top;
    svg.appendChild(el("line", { class: "grid", x1: x0, x2: x1, y1: y, y2: y }));
    svg.appendChild(el("text", { x: x0 - 5, y: y + 4, "text-anchor": "end" }, String(t)));
  }
  if (right) {
    for (const t of right.ticks) {
      const y = y0 - ((y0 - y1) * t) / right.top;
      svg.appendChild(el("text", { x: x1 + 5, y: y + 4 }, String(t)));
    }
  }
  svg.appendChild(el("line", { class: "axis", x1: x0, x2: x1, y1: y0, y2: y0 }));
  svg.appendChild(el("line", { class: "axis", x1: x0, x2: x0, y1: y1, y2: y0 }));
  if (right) svg.appendChild(el("line", { class: "axis", x1: x1, x2: x1, y1: y1, y2: y0 }));
  svg.appendChild(el("text", { x: (x0 + x1) / 2, y: h - 4, "text-anchor": "middle" }, xLabel));
  svg.appendChild(el("text", { x: 12, y: (y0 + y1) / 2, transform: `rotate(-90 12 ${(y0 + y1) / 2})`, "text-anchor": "middle" }, leftLabel));
  if (right) {
    svg.appendChild(el("text", { x: w - 6, y: (y0 + y1) / 2, transform: `rotate(90 ${w - 6} ${(y0 + y1) / 2})`, "text-anchor": "middle" }, rightLabel));
  }
  return { x0, x1, y0, y1 };
}

function polyline(svg, cls, pts) {
  if (pts.length) svg.appendChild(el("polyline", { class: cls, points: pts.map((p) => p.join(",")).join(" ") }));
}

function emptyChart(svg, w, h, msg) {
  svg.appendChild(el("text", { class: "empty", x: w / 2, y: h / 2, "text-anchor": "middle" }, msg));
}

function renderTimeline(t) {
  const svg = $("timeline");
  const W = 1000, H = 260, m = { l: 56, r: 50, t: 10, b: 34 };
  svg.replaceChildren();
  const n = t.gen_tok_s.length;
  if (n === 0) return emptyChart(svg, W, H, "no complete second yet");
  const span = Math.max(n, 60);
  const left = niceTicks(Math.max(...t.gen_tok_s), 5);
  const right = niceTicks(Math.max(1, ...t.in_flight_max), 5);
  const end = t.from_s + n;
  const xOf = (sec) => m.l + ((W - m.l - m.r) * (sec - (end - span))) / span;
  const xt = [];
  const tickStep = span > 600 ? 120 : span > 240 ? 60 : span > 120 ? 30 : 10;
  for (let ago = 0; ago <= span; ago += tickStep) {
    xt.push([xOf(end - ago), ago === 0 ? "now" : "−" + ago]);
  }
  const f = frame(svg, W, H, m, xt, "seconds ago (each point: one complete second)", left,
    "generated tok/s", right, "requests in flight");
  const yL = (v) => f.y0 - ((f.y0 - f.y1) * v) / left.top;
  const yR = (v) => f.y0 - ((f.y0 - f.y1) * v) / right.top;
  // Steady runs as bands under the lines.
  for (let i = 0; i < n; ) {
    if (!t.steady[i]) { i++; continue; }
    let j = i;
    while (j < n && t.steady[j] && t.in_flight_min[j] === t.in_flight_min[i]) j++;
    const xa = xOf(t.from_s + i), xb = xOf(t.from_s + j);
    svg.appendChild(el("rect", { class: "steady", x: xa, y: f.y1, width: Math.max(1, xb - xa), height: f.y0 - f.y1 }));
    if (xb - xa > 40) {
      svg.appendChild(el("text", { x: (xa + xb) / 2, y: f.y1 + 12, "text-anchor": "middle" }, "N = " + t.in_flight_min[i]));
    }
    i = j;
  }
  saturationBands(svg, t, xOf, f);
  polyline(svg, "gen", t.gen_tok_s.map((v, i) => [xOf(t.from_s + i + 0.5), yL(v)]));
  const inf = [];
  t.in_flight_mean.forEach((v, i) => {
    inf.push([xOf(t.from_s + i), yR(v)], [xOf(t.from_s + i + 1), yR(v)]);
  });
  polyline(svg, "inf", inf);
}

// The headline tile, the per-level table and the pace chart, from /stats' service_level.
function slHeadline(c) {
  if (c.in_flight === null) return "–";
  return (c.reached ? "" : "≥ ") + c.in_flight;
}

function renderServiceLevel(v) {
  const c = v.capacity;
  setText("sl_capacity", slHeadline(c));
  setText("sl_note", c.in_flight === null ? c.text : c.reached
    ? (c.binds || "attainment") + " binds at " + c.first_miss
    : "not reached: no level has missed yet");
  $("sl_capacity").className = c.in_flight === null ? "" : "okc";
  document.body.dataset.capacity = c.in_flight === null ? "" : String(c.in_flight);
  document.body.dataset.capacityReached = String(c.reached);
  setText("sl_min", String(v.objective.min_requests));
  setText("sl_objective", "Objective: " + v.objective_text + ". Capacity: " + c.text +
    (v.model ? ". Decode-step model τ(N) = " + num(v.model.a_ms, 2) + " + " + num(v.model.b_ms, 3) +
      " × N ms, fitted to " + v.model.levels + " levels (N " + v.model.range[0] + "–" + v.model.range[1] + ")"
      : ". No decode-step model: " + v.model_reason) + ".");
  const rows = v.levels;
  const body = $("service_level").tBodies[0];
  while (body.rows.length > rows.length) body.deleteRow(-1);
  rows.forEach((r, i) => {
    const tr = body.rows[i] || body.insertRow();
    while (tr.cells.length < 10) tr.insertCell();
    tr.id = "sl-" + r.in_flight;
    tr.className = r.thin ? "thin" : "";
    const m = r.missed;
    const vals = [
      String(r.in_flight) + (r.thin ? " (thin)" : ""),
      String(r.requests),
      num(r.attainment_pct, 1),
      r.attainment_ci_pct ? num(r.attainment_ci_pct[0], 1) + " – " + num(r.attainment_ci_pct[1], 1) : "–",
      [m.ttft, m.pace, m.ttft_pace, m.e2e, m.error].join(" / "),
      num(r.seconds, 1),
      num(r.gen_tok_s, 1) + (r.gen_tok_s_ci === null ? "" : " ± " + num(r.gen_tok_s_ci, 1)),
      num(r.per_request_tok_s, 1),
      r.model_per_request_tok_s === null ? "–"
        : num(r.model_per_request_tok_s, 1) + " [" + num(r.model_band_tok_s[0], 1) + " – " + num(r.model_band_tok_s[1], 1) + "]",
      num(r.goodput_tok_s, 1),
    ];
    vals.forEach((x, j) => {
      if (tr.cells[j].textContent !== x) tr.cells[j].textContent = x;
    });
  });

  const svg = $("sl_chart");
  svg.replaceChildren();
  const W = 1000, H = 240, mg = { l: 56, r: 20, t: 10, b: 34 };
  const paced = rows.filter((r) => r.per_request_tok_s !== null);
  if (!paced.length) {
    emptyChart(svg, W, H, "no level with clean time yet");
    return;
  }
  const line = 1000 / v.objective.max_tpot_ms;
  const maxN = Math.max(...rows.map((r) => r.in_flight), c.first_miss || 0) + 1;
  const measuredTop = Math.max(line, ...paced.map((r) => r.per_request_tok_s));
  const bandTop = Math.min(1.5 * measuredTop, Math.max(0, ...rows.filter((r) => r.model_band_tok_s).map((r) => r.model_band_tok_s[1])));
  const ys = niceTicks(1.1 * Math.max(measuredTop, bandTop), 5);
  const xs = niceTicks(maxN, 8);
  const xOf = (n) => mg.l + ((W - mg.l - mg.r) * n) / xs.top;
  const f = frame(svg, W, H, mg, xs.ticks.map((t) => [xOf(t), String(t)]), "requests in flight (N)", ys, "per-request tok/s", null, "");
  const yOf = (t) => f.y0 - ((f.y0 - f.y1) * Math.min(t, ys.top)) / ys.top;
  const modelled = rows.filter((r) => r.model_band_tok_s);
  if (modelled.length) {
    const band = modelled.map((r) => [xOf(r.in_flight), yOf(r.model_band_tok_s[1])])
      .concat(modelled.slice().reverse().map((r) => [xOf(r.in_flight), yOf(r.model_band_tok_s[0])]));
    svg.appendChild(el("polygon", { class: "band", points: band.map((p) => p.join(",")).join(" ") }));
    polyline(svg, "model", modelled.map((r) => [xOf(r.in_flight), yOf(r.model_per_request_tok_s)]));
  }
  svg.appendChild(el("line", { class: "service", x1: f.x0, x2: f.x1, y1: yOf(line), y2: yOf(line) }));
  if (c.in_flight) svg.appendChild(el("line", { class: "headline", x1: xOf(c.in_flight), x2: xOf(c.in_flight), y1: f.y1, y2: f.y0 }));
  for (const r of paced) {
    svg.appendChild(el("circle", { class: r.thin ? "dot-thin" : "dot-per", cx: xOf(r.in_flight), cy: yOf(r.per_request_tok_s), r: 4 }));
  }
}

function renderCapacity(rows) {
  const body = $("capacity").tBodies[0];
  while (body.rows.length > rows.length) body.deleteRow(-1);
  rows.forEach((r, i) => {
    const tr = body.rows[i] || body.insertRow();
    while (tr.cells.length < 9) tr.insertCell();
    tr.id = "cap-" + r.in_flight;
    const vals = [
      String(r.in_flight),
      String(r.seconds),
      num(r.gen_tok_s.mean, 1),
      num(r.gen_tok_s.stdev, 1),
      num(r.per_request_tok_s.avg, 1),
      num(r.ttft_ms.p50, 1),
      num(r.ttft_ms.p90, 1),
      r.scaling === null ? "–" : num(r.scaling, 2) + "×",
      r.marginal_gain === null ? "–" : num(100 * r.marginal_gain, 1) + " %",
    ];
    vals.forEach((v, j) => {
      if (tr.cells[j].textContent !== v) tr.cells[j].textContent = v;
    });
  });
  const W = 500, H = 240, m = { l: 56, r: 50, t: 10, b: 34 };
  for (const id of ["cap_tput", "cap_ttft"]) $(id).replaceChildren();
  if (!rows.length) {
    emptyChart($("cap_tput"), W, H, "no steady second yet");
    emptyChart($("cap_ttft"), W, H, "no steady second yet");
    return;
  }
  const maxN = rows[rows.length - 1].in_flight;
  const xs = niceTicks(maxN, 6);
  const xOf = (n) => m.l + ((W - m.l - m.r) * n) / xs.top;
  const xt = xs.ticks.map((v) => [xOf(v), String(v)]);

  const svg = $("cap_tput");
  const left = niceTicks(Math.max(...rows.map((r) => r.gen_tok_s.mean)), 5);
  const right = niceTicks(Math.max(...rows.map((r) => r.per_request_tok_s.avg)), 5);
  const f = frame(svg, W, H, m, xt, "requests in flight (N)", left, "aggregate tok/s", right, "per-request tok/s");
  const yL = (v) => f.y0 - ((f.y0 - f.y1) * v) / left.top;
  const yR = (v) => f.y0 - ((f.y0 - f.y1) * v) / right.top;
  polyline(svg, "gen", rows.map((r) => [xOf(r.in_flight), yL(r.gen_tok_s.mean)]));
  polyline(svg, "per", rows.map((r) => [xOf(r.in_flight), yR(r.per_request_tok_s.avg)]));
  for (const r of rows) {
    svg.appendChild(el("circle", { class: "dot-gen", cx: xOf(r.in_flight), cy: yL(r.gen_tok_s.mean), r: 3 }));
    svg.appendChild(el("circle", { class: "dot-per", cx: xOf(r.in_flight), cy: yR(r.per_request_tok_s.avg), r: 3 }));
  }

  const svg2 = $("cap_ttft");
  const withT = rows.filter((r) => r.ttft_ms.p50 !== null);
  const ty = niceTicks(Math.max(1, ...withT.map((r) => r.ttft_ms.p90 || r.ttft_ms.p50)), 5);
  const f2 = frame(svg2, W, H, m, xt, "requests in flight at arrival (N)", ty, "TTFT, ms", null, "");
  const y2 = (v) => f2.y0 - ((f2.y0 - f2.y1) * v) / ty.top;
  for (const [key, cls] of [["p50", "p50"], ["p90", "p90"]]) {
    const pts = withT.filter((r) => r.ttft_ms[key] !== null).map((r) => [xOf(r.in_flight), y2(r.ttft_ms[key])]);
    polyline(svg2, cls, pts);
    for (const p of pts) svg2.appendChild(el("circle", { class: "dot-" + cls, cx: p[0], cy: p[1], r: 3 }));
  }
  if (!withT.length) emptyChart(svg2, W, H, "no TTFT at any level yet");
}

// ---- controls ----
$("window").addEventListener("change", (e) => {
  state.window = e.target.value;
  state.page = 0;
});
$("user_filter").addEventListener("input", (e) => {
  state.filter = e.target.value.trim();
  state.page = 0;
  if (state.snap) renderUsers(state.snap, state.snap.windows[state.window]);
});
$("prev").addEventListener("click", () => {
  state.page = Math.max(0, state.page - 1);
  if (state.snap) renderUsers(state.snap, state.snap.windows[state.window]);
});
$("next").addEventListener("click", () => {
  state.page += 1;
  if (state.snap) renderUsers(state.snap, state.snap.windows[state.window]);
});

poll();

// The dashboard: a row per rule of a domain, allowed and denied per second drawn by uPlot, from the compact JSON of
// /ui/api/series (asked every 2 s for the seconds after the last one held) and /ui/api/overview (every 6 s).
"use strict";

const params = new URLSearchParams(location.search);
const token = params.get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};
const HOLD = 900; // seconds held: the longest range
const MOST_CHARTS = 40; // charts drawn at once (labels built from requests can make many rules)
const COLOURS = { allowed: "#1f6fb4", denied: "#d1401f", reported: "#6a51a3" };
const KINDS = ["allowed", "denied", "reported"]; // a report (a cost budget's) is no decision: drawn apart
// The y axis counts whole requests: whole steps only.
const WHOLE_STEPS = [1, 2, 5].flatMap(m => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9].map(p => m * p)).sort((a, b) => a - b);
const $ = id => document.getElementById(id);

const state = {
  domain: "",
  range: Number(params.get("range")) || 900,
  from: 0, // the first second held
  to: -1, // the last second held; -1: nothing yet
  counts: new Map(), // rule -> { allowed: [], denied: [], reported: [] }, index i is second from + i
  rules: [], // the overview's rule_limits
  instances: null,
  ticks: 0,
};
const charts = new Map(); // rule -> uPlot
window.dashboard = { state, charts };

async function get(path) {
  const response = await fetch(path, { headers, cache: "no-store" });
  if (!response.ok) throw new Error(path.split("?")[0] + ": " + response.status + " " + (await response.text()).trim());
  return response;
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  e.append(...children.filter(c => c !== null && c !== undefined));
  return e;
}

function plural(n, one, many) {
  return n + " " + (n === 1 ? one : many);
}

function rangeWords(seconds) {
  return seconds / 60 + " min";
}

// Adds a series answer to what is held: the seconds after `to` are appended; a gap (or a first answer) starts over.
function absorb(answer) {
  if (state.to < 0 || answer.from !== state.to + 1) {
    state.counts = new Map();
    state.from = answer.from;
    state.to = answer.from - 1;
  }
  const n = answer.to - answer.from + 1;
  if (n > 0) {
    const held = state.to - state.from + 1;
    for (const [rule, c] of Object.entries(answer.rules)) {
      if (!state.counts.has(rule)) state.counts.set(rule, Object.fromEntries(KINDS.map(k => [k, new Array(held).fill(0)])));
      const mine = state.counts.get(rule);
      for (const k of KINDS) mine[k].push(...(c[k] || new Array(n).fill(0)));
    }
    for (const [rule, mine] of state.counts) {
      if (!(rule in answer.rules)) {
        for (const k of KINDS) for (let i = 0; i < n; i++) mine[k].push(0);
      }
    }
    state.to = answer.to;
    const drop = state.to - state.from + 1 - HOLD;
    if (drop > 0) {
      for (const mine of state.counts.values()) for (const k of KINDS) mine[k].splice(0, drop);
      state.from += drop;
    }
  }
  state.instances = answer.instances;
}

// The seconds of the range in view and each rule's counts over them: [xs, allowed, denied], and reported when the
// rule has reports in the range.
function view(rule) {
  const first = state.to - state.range + 1;
  const xs = [];
  for (let s = first; s <= state.to; s++) xs.push(s);
  const mine = state.counts.get(rule);
  const pick = key => xs.map(s => (mine && s >= state.from ? mine[key][s - state.from] : 0));
  const data = [xs, pick("allowed"), pick("denied")];
  const reported = pick("reported");
  if (reported.some(n => n > 0)) data.push(reported);
  return data;
}

const two = n => String(n).padStart(2, "0");
// A second as the clock shows it, in the browser's time zone: 12:21:07 (12:21 when `seconds` is false).
function clock(s, seconds) {
  const d = new Date(s * 1000);
  return two(d.getHours()) + ":" + two(d.getMinutes()) + (seconds ? ":" + two(d.getSeconds()) : "");
}

// A legend value: the second under the cursor, or, away from it (idx null: before the first hover, after the mouse
// leaves), the last second's.
function legendValue(format) {
  return (u, v, series, idx) => {
    if (idx === null || idx === undefined) {
      const values = u.data[series];
      v = values && values.length ? values[values.length - 1] : null;
    }
    return v === null || v === undefined ? "–" : format(v);
  };
}

function chartOptions(width, reports) {
  const count = legendValue(String);
  const line = kind => ({ label: kind, stroke: COLOURS[kind], fill: COLOURS[kind] + "1a", width: 1.5, value: count,
    points: { show: false } });
  return {
    width,
    height: 150,
    padding: [10, 30, 0, 0], // room on the right for the last time label
    cursor: { drag: { x: false, y: false }, points: { size: 6 } },
    legend: { live: true },
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, Math.ceil(max * 1.15))] } },
    axes: [
      // Seconds on the ticks when a tick falls within a minute; minutes otherwise.
      { stroke: "#555", grid: { stroke: "#eee" }, space: 60,
        values: (u, splits) => splits.map(s => clock(s, splits.some(t => t % 60))) },
      { stroke: "#555", grid: { stroke: "#eee" }, size: 48, incrs: WHOLE_STEPS,
        values: (u, splits) => splits.map(v => String(v)),
        label: "per second", labelSize: 18, labelFont: "11px system-ui" },
    ],
    series: [
      { label: "second", value: legendValue(v => clock(v, true)) },
      line("allowed"),
      line("denied"),
      ...(reports ? [line("reported")] : []),
    ],
  };
}

function limitsText(rule) {
  const info = state.rules.find(r => r.rule === rule);
  if (!info) return el("span", { class: "limits" }, "not in the rules in force (a label built from requests)");
  const parts = [];
  info.limits.forEach((l, i) => {
    if (i > 0) parts.push(" and ");
    parts.push(l.limit);
    if (l.name) parts.push(" ", el("span", { class: "name", "data-name": l.name }, l.name));
  });
  if (!info.limits.length) parts.push("no limit");
  for (const note of info.notes) parts.push(", " + note);
  return el("span", { class: "limits" }, ...parts);
}

function percent(part, whole) {
  return whole ? (100 * part / whole).toFixed(1) + " %" : "–";
}

// A rule's totals over the range in view: allowed, denied, reported.
function totals(rule) {
  const sums = { allowed: 0, denied: 0, reported: 0 };
  const mine = state.counts.get(rule);
  if (!mine) return sums;
  const first = Math.max(0, state.to - state.range + 1 - state.from);
  for (const k of KINDS) for (let i = first; i < mine[k].length; i++) sums[k] += mine[k][i];
  return sums;
}

// A row per rule: the rules in force, then any other label the counts carry. The most denied first (most requests
// denied over the range in view), then the busiest (most decisions and reports), then in the rules' order; rules
// with nothing in the range last, in the rules' order.
function draw() {
  const rows = $("rows");
  const all = state.rules.map(r => r.rule);
  for (const rule of state.counts.keys()) if (!all.includes(rule)) all.push(rule);
  const sums = new Map(all.map(r => [r, totals(r)]));
  const busy = r => sums.get(r).allowed + sums.get(r).denied + sums.get(r).reported;
  const names = all.filter(r => busy(r) > 0)
    .sort((a, b) => sums.get(b).denied - sums.get(a).denied || busy(b) - busy(a) || all.indexOf(a) - all.indexOf(b))
    .concat(all.filter(r => busy(r) === 0));
  const width = Math.max(300, rows.clientWidth - 30);
  const wanted = $("filter").value.trim().toLowerCase();
  let drawn = 0;
  const keep = new Set(names);
  for (const [rule, chart] of charts) {
    if (!keep.has(rule)) { chart.destroy(); charts.delete(rule); }
  }
  for (const row of [...rows.children]) if (!keep.has(row.dataset.rule)) row.remove();
  names.forEach((rule, i) => {
    let row = [...rows.children].find(r => r.dataset.rule === rule);
    if (!row) {
      row = el("article", { class: "rule", "data-rule": rule },
        el("div", { class: "head" }, el("h3", {}, rule), el("span", { class: "limits" }), el("span", { class: "figures" })),
        el("p", { class: "quiet" }), el("div", { class: "chart" }));
    }
    if (rows.children[i] !== row) rows.insertBefore(row, rows.children[i] || null);
    row.querySelector(".limits").replaceWith(limitsText(rule));
    const data = view(rule);
    const { allowed, denied, reported } = sums.get(rule);
    const reports = data.length > 3;
    const last = data[0].length - 1;
    Object.assign(row.dataset, {
      allowed, denied, reported,
      denialRatio: allowed + denied ? (denied / (allowed + denied)).toFixed(4) : "",
      lastSecond: data[0][last], lastAllowed: data[1][last], lastDenied: data[2][last],
      lastReported: reports ? data[3][last] : 0,
    });
    const figures = row.querySelector(".figures");
    const quiet = row.querySelector(".quiet");
    const shown = wanted === "" || rule.toLowerCase().includes(wanted);
    const room = shown && drawn < MOST_CHARTS;
    if (allowed + denied + reported === 0 || !room) {
      figures.textContent = "";
      quiet.textContent = allowed + denied + reported === 0
        ? "No decisions in the last " + rangeWords(state.range) + "."
        : "Not drawn: " + MOST_CHARTS + " charts at most; the filter narrows the rules.";
      quiet.hidden = false;
      if (charts.has(rule)) { charts.get(rule).destroy(); charts.delete(rule); }
      return;
    }
    drawn++;
    quiet.hidden = true;
    figures.replaceChildren(
      "last " + rangeWords(state.range) + ": ", el("b", {}, String(allowed)), " allowed, ", el("b", {}, String(denied)),
      " denied",
      ...(allowed + denied ? [", ", el("b", { class: denied ? "bad" : "" }, percent(denied, allowed + denied) + " denied")] : []),
      ...(reports ? [" · ", el("b", {}, String(reported)), " " + (reported === 1 ? "cost" : "costs") + " reported"] : []),
      " · last second: " + data[1][last] + " allowed, " + data[2][last] + " denied" +
        (reports ? ", " + data[3][last] + " reported" : ""));
    let chart = charts.get(rule);
    if (chart && chart.series.length !== data.length) {
      // Reports came into the range or left it: a series more or less.
      chart.destroy();
      charts.delete(rule);
      chart = undefined;
    }
    if (!chart) {
      chart = new uPlot(chartOptions(width, reports), data, row.querySelector(".chart"));
      charts.set(rule, chart);
    } else {
      if (chart.width !== width) chart.setSize({ width, height: 150 });
      chart.setData(data);
    }
    // Away from the cursor, the legend shows the last second (see legendValue).
    if (!(chart.cursor.left >= 0)) chart.setLegend({ idx: null });
  });
  filter();
  $("rows").dataset.range = state.range;
}

function filter() {
  const wanted = $("filter").value.trim().toLowerCase();
  let shown = 0;
  for (const row of $("rows").children) {
    row.hidden = wanted !== "" && !row.dataset.rule.toLowerCase().includes(wanted);
    if (!row.hidden) shown++;
  }
  $("rows").dataset.shown = shown;
}

function fill(id, rows) {
  const columns = document.querySelectorAll("#" + id + " th").length;
  if (!rows.length) rows = [[el("td", { colspan: columns, class: "none" }, "none")]];
  document.querySelector("#" + id + " tbody").replaceChildren(...rows.map(cells => el("tr", {}, ...cells)));
}

function cell(text, numeric) {
  return el("td", numeric ? { class: "n" } : {}, String(text));
}

function showHealth(health) {
  const store = health.store;
  const storeLine = $("health-store");
  storeLine.dataset.ready = store.ready;
  storeLine.dataset.kind = store.kind;
  storeLine.replaceChildren("store (" + store.kind + "): ",
    store.ready
      ? el("span", { class: "good" }, "ready, answered a ping in " + (store.ping_ms ? store.ping_ms + " ms" : "under 0.01 ms"))
      : el("span", { class: "bad" }, "not ready: " + store.error));
  const breaker = $("health-breaker");
  breaker.dataset.state = health.breaker;
  const says = { closed: "closed: calls reach the store", "half-open": "half-open: probing the store", open: "open: calls to the store fail fast" };
  breaker.replaceChildren("circuit breakers: ",
    el("span", { class: health.breaker === "closed" ? "good" : "bad" }, says[health.breaker] || health.breaker));
  $("problems").replaceChildren(...health.problems.map(p => el("li", { class: "bad" }, p)));
}

function showInstances() {
  const i = state.instances;
  if (!i) return;
  const line = $("health-instances");
  line.dataset.count = i.count;
  const others = i.seen.filter(s => s.instance !== i.this).map(s => s.instance);
  line.textContent = "instances: " + plural(i.count, "instance", "instances") +
    " on this store in the last 5 s, their counts summed (this one: " + i.this +
    (others.length ? "; also " + others.join(", ") : "") + ")";
}

function showOverview(o) {
  state.rules = o.rule_limits;
  showHealth(o.health);
  const lists = $("health-lists");
  lists.dataset.count = o.lists.length;
  lists.textContent = o.lists.length ? "lists: " + o.lists.join("; ") : "lists: none in this domain";
  const offenders = [];
  for (const r of o.offenders) {
    const hits = new Map(r.hits.map(h => [h.value, h.count]));
    for (const v of r.denied.length ? r.denied : r.hits) {
      const denied = r.denied.find(d => d.value === v.value);
      offenders.push([cell(r.rule), cell(v.value), cell(denied ? denied.count : 0, true), cell(hits.get(v.value) || 0, true)]);
    }
  }
  fill("offenders", offenders);
  fill("budgets", o.budgets.map(s => [cell(s.labels.rule), cell(s.labels.limit), cell(s.labels.kind), cell(s.value, true)]));
  $("rlqs-words").replaceChildren(...o.rlqs_words.map(w => el("li", {}, w)));
  $("shares").replaceChildren(...o.rlqs_assignments.map(a => el("li", { "data-bucket": a.bucket, "data-strategy": a.strategy }, a.words)));
}

let busy = false;
async function refresh() {
  if (busy || !state.domain) return;
  busy = true;
  const domain = state.domain;
  const q = "?domain=" + encodeURIComponent(domain);
  try {
    const wanted = [get("/ui/api/series" + q + "&range=" + HOLD + (state.to >= 0 ? "&since=" + state.to : ""))];
    if (state.ticks % 3 === 0) wanted.push(get("/ui/api/overview" + q));
    const [series, overview] = await Promise.all(wanted);
    const text = await series.text();
    if (domain !== state.domain) return;
    if (overview) showOverview(await overview.json());
    absorb(JSON.parse(text));
    showInstances();
    draw();
    state.ticks++;
    $("status").className = "";
    $("status").textContent = "updated " + clock(Date.now() / 1000, true);
  } catch (e) {
    $("status").className = "error";
    $("status").textContent = String(e.message || e);
  } finally {
    busy = false;
  }
}

function setRange(seconds) {
  state.range = seconds;
  for (const b of document.querySelectorAll("#ranges button")) b.setAttribute("aria-pressed", String(Number(b.dataset.range) === seconds));
  if (state.to >= 0) draw();
}

function setDomain(domain) {
  state.domain = domain;
  state.to = -1;
  state.rules = [];
  state.ticks = 0;
  state.counts = new Map();
  for (const chart of charts.values()) chart.destroy();
  charts.clear();
  $("rows").replaceChildren();
  refresh();
}

async function start() {
  try {
    const domains = await get("/ui/api/domains").then(r => r.json());
    $("domain").replaceChildren(...domains.map(d => new Option(d, d)));
    const wanted = params.get("domain");
    if (wanted && domains.includes(wanted)) $("domain").value = wanted;
  } catch (e) {
    $("status").className = "error";
    $("status").textContent = String(e.message || e);
    return;
  }
  $("domain").addEventListener("change", () => setDomain($("domain").value));
  for (const b of document.querySelectorAll("#ranges button")) b.addEventListener("click", () => setRange(Number(b.dataset.range)));
  $("filter").addEventListener("input", () => (state.to >= 0 ? draw() : filter()));
  window.addEventListener("resize", () => { if (state.to >= 0) draw(); });
  setRange([60, 300, 900].includes(state.range) ? state.range : 900);
  setDomain($("domain").value);
  setInterval(refresh, 2000);
}
start();

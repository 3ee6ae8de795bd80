// The metrics page: one Plotly trace per run for the chosen metric, EMA smoothing, log scale; polls the
// append-only metrics.jsonl (from the byte offset the API returned) every 2 s while a shown run is running.
"use strict";

const POLL_MS = 2000;
const state = {runs: [], series: {}, next: {}, metric: null, info: {}};

/** TensorBoard's debiased exponential moving average with weight `w` in [0, 1). */
function smooth(ys, w) {
  if (!w) return ys;
  let last = 0, n = 0;
  return ys.map(y => {
    if (y === null || !isFinite(y)) return y;
    n += 1;
    last = last * w + (1 - w) * y;
    return last / (1 - Math.pow(w, n));
  });
}

/** Fetch run `i`'s new metrics lines (all of them the first time) into state.series[i] (step -> record). */
async function load(i) {
  const since = state.next[i] || 0;
  const body = await api(`/api/runs/${i}/metrics?since=${since}`);
  if (body.reset || !state.series[i]) state.series[i] = new Map();
  for (const rec of body.records) state.series[i].set(rec.step, rec);  // a step logged again: the last line wins
  state.next[i] = body.next;
  return body.records.length > 0 || body.reset;
}

function metricNames() {
  const names = new Set();
  for (const i of state.runs) for (const rec of (state.series[i] || new Map()).values())
    for (const [k, v] of Object.entries(rec)) if (k !== "step" && typeof v === "number") names.add(k);
  return [...names].sort();
}

function fillSelect() {
  const select = document.getElementById("metric-select");
  const names = metricNames();
  if (!state.metric || !names.includes(state.metric))
    state.metric = names.find(n => n === "reward/mean") || names.find(n => n.endsWith("loss")) || names[0] || null;
  const current = [...select.options].map(o => o.value).join("\n");
  if (current !== names.join("\n")) select.replaceChildren(...names.map(n => el("option", {value: n}, n)));
  if (state.metric) select.value = state.metric;
}

function draw() {
  const w = parseFloat(document.getElementById("smoothing").value);
  document.getElementById("smoothing-value").textContent = w.toFixed(2);
  const log = document.getElementById("log-scale").checked;
  const traces = state.runs.map(i => {
    const recs = [...(state.series[i] || new Map()).values()].filter(r => typeof r[state.metric] === "number")
      .sort((a, b) => a.step - b.step);
    return {x: recs.map(r => r.step), y: smooth(recs.map(r => r[state.metric]), w), mode: "lines",
            name: state.info[i] ? state.info[i].name : String(i), type: "scatter"};
  });
  const layout = {xaxis: {title: {text: "step"}}, yaxis: {title: {text: state.metric || ""}, type: log ? "log" : "linear"},
                  margin: {t: 30}, showlegend: true, uirevision: state.metric};
  Plotly.react("metrics-chart", traces, layout, {displaylogo: false, responsive: true});
  const url = new URL(location.href);
  url.searchParams.set("runs", state.runs.join(","));
  if (state.metric) url.searchParams.set("metric", state.metric);
  history.replaceState(null, "", url);
}

async function poll() {
  const live = state.runs.filter(i => state.info[i] && state.info[i].status === "running");
  document.getElementById("poll-status").textContent = live.length ? "live: refreshing every 2 s" : "";
  if (!live.length) return;
  let changed = false;
  for (const i of live) changed = (await load(i).catch(() => false)) || changed;
  for (const i of live) {
    const info = await api(`/api/runs/${i}`).catch(() => null);
    if (info) state.info[i] = info;
  }
  if (changed) { fillSelect(); draw(); }
  setTimeout(poll, POLL_MS);
}

function picker(all) {
  const box = document.getElementById("run-picker");
  box.replaceChildren(...all.filter(r => !r.error).map(r => {
    const input = el("input", {type: "checkbox", "data-run": r.index, checked: state.runs.includes(r.index)});
    input.addEventListener("change", async () => {
      state.runs = [...box.querySelectorAll("input:checked")].map(x => Number(x.dataset.run));
      for (const i of state.runs) if (!state.series[i]) await load(i);
      fillSelect(); draw();
    });
    return el("label", {}, input, r.name, " ");
  }));
}

async function main() {
  nav();
  const params = new URLSearchParams(location.search);
  const all = (await api("/api/runs")).runs;
  for (const r of all) state.info[r.index] = r;
  const asked = (params.get("runs") || "").split(",").filter(Boolean);
  state.runs = [];
  for (const key of asked) {
    const run = all.find(r => String(r.index) === key || r.name === key);
    if (!run) { showError(`no run ${key}; runs: ${all.map(r => `${r.index} (${r.name})`).join(", ")}`); continue; }
    if (run.error) { showError(run.error); continue; }
    state.runs.push(run.index);
  }
  if (!asked.length) state.runs = all.filter(r => !r.error).map(r => r.index);
  state.metric = params.get("metric");
  picker(all);
  for (const i of state.runs) await load(i).catch(() => {});
  fillSelect();
  document.getElementById("metric-select").addEventListener("change", e => { state.metric = e.target.value; draw(); });
  document.getElementById("smoothing").addEventListener("input", draw);
  document.getElementById("log-scale").addEventListener("change", draw);
  draw();
  setTimeout(poll, POLL_MS);
}

main().catch(err => console.error(err));

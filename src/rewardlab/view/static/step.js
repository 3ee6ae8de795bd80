// The rollouts of one step: a server-side filtered, sorted, paginated table; a group's rollouts side by side.
"use strict";

const [, RUN, , STEP] = pathParts();
const LIMIT = 100;
const FIRST = ["index", "group", "reward", "advantage", "kept", "error", "truncated", "termination", "staleness",
               "num_tokens", "logged", "completion"];
const HIDDEN = new Set(["step", "prompt_key"]);
const state = {offset: 0, sort: null, desc: false, filter: ""};

function orderColumns(columns) {
  const rewards = columns.filter(c => c.startsWith("reward/"));
  const first = FIRST.flatMap(c => c === "reward" ? [c, ...rewards] : [c]).filter(c => columns.includes(c));
  return [...first, ...columns.filter(c => !first.includes(c) && !HIDDEN.has(c))];
}

function syncUrl() {
  const url = new URL(location.href);
  for (const [k, v] of [["filter", state.filter], ["sort", state.sort], ["desc", state.desc ? "1" : ""],
                        ["offset", state.offset ? String(state.offset) : ""]]) {
    if (v) url.searchParams.set(k, v); else url.searchParams.delete(k);
  }
  history.replaceState(null, "", url);
}

async function load() {
  const q = new URLSearchParams({offset: state.offset, limit: LIMIT, filter: state.filter});
  if (state.sort) { q.set("sort", state.sort); q.set("desc", state.desc ? "1" : "0"); }
  let body;
  try { body = await api(`/api/runs/${encodeURIComponent(RUN)}/steps/${encodeURIComponent(STEP)}/rollouts?${q}`); }
  catch (err) { return; }
  showError("");
  syncUrl();
  const cols = orderColumns(body.columns);
  const table = document.getElementById("rollouts-table");
  table.tHead.replaceChildren(el("tr", {}, ...cols.map(c => {
    const th = el("th", {"data-col": c, class: c === state.sort ? (state.desc ? "sorted-desc" : "sorted-asc") : null}, c);
    th.addEventListener("click", () => {
      state.desc = state.sort === c ? !state.desc : false;
      state.sort = c; state.offset = 0; load();
    });
    return th;
  })));
  table.tBodies[0].replaceChildren(...body.rows.map(row => {
    const tr = el("tr", {"data-index": row.index});
    for (const c of cols) {
      const td = el("td", {"data-col": c}, fmt(row[c]));
      if (c === "group") {
        const button = el("button", {class: "group-button", "data-group": row.group}, "side by side");
        button.addEventListener("click", e => { e.stopPropagation(); showGroup(row.group); });
        td.append(" ", button);
      }
      if (c === "index" && row.prompt_key !== null && row.prompt_key !== undefined)
        td.append(" ", el("a", {href: `/runs/${encodeURIComponent(RUN)}/prompts/${encodeURIComponent(row.prompt_key)}`,
                                class: "prompt-link", onclick: e => e.stopPropagation()}, "prompt"));
      tr.append(td);
    }
    tr.addEventListener("click", () => {
      location.href = `/runs/${encodeURIComponent(RUN)}/steps/${encodeURIComponent(STEP)}/rollouts/${row.index}`;
    });
    return tr;
  }));
  document.getElementById("counts").textContent = `${body.matched} of ${body.total} rollouts`;
  const last = Math.min(body.offset + body.rows.length, body.matched);
  document.getElementById("page-info").textContent = body.matched ? ` ${body.offset + 1}–${last} ` : " 0 ";
  document.getElementById("prev-page").disabled = body.offset === 0;
  document.getElementById("next-page").disabled = last >= body.matched;
}

/** #group-view: the group's rollouts side by side (completion, reward, components, advantage, kept). */
async function showGroup(group) {
  const view = document.getElementById("group-view");
  let body;
  try { body = await api(`/api/runs/${encodeURIComponent(RUN)}/steps/${encodeURIComponent(STEP)}/groups/${group}`); }
  catch (err) { return; }
  view.replaceChildren(el("h2", {}, `Group ${group}`), el("div", {class: "text"}, body.prompt || ""),
    el("div", {class: "group-grid"}, ...body.rollouts.map(r => el("div", {class: "card", "data-index": r.index},
      el("a", {href: `/runs/${encodeURIComponent(RUN)}/steps/${encodeURIComponent(STEP)}/rollouts/${r.index}`},
         `rollout ${r.index}`),
      el("div", {}, `reward ${fmt(r.reward)} · advantage ${fmt(r.advantage)} · kept ${fmt(r.kept)}`),
      el("div", {class: "muted"}, Object.entries(r.components || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ")),
      r.error ? el("div", {class: "status-crashed"}, `error: ${r.error}`) : null,
      el("div", {class: "muted"}, `termination ${fmt(r.termination)}${r.truncated ? " · truncated" : ""}`),
      el("div", {class: "text"}, r.completion || "")))));
  view.hidden = false;
  view.scrollIntoView();
}

async function main() {
  nav(RUN); navSteps(RUN);
  document.querySelector("h1").textContent = `Rollouts of step ${STEP}`;
  const params = new URLSearchParams(location.search);
  state.filter = params.get("filter") || "";
  state.sort = params.get("sort");
  state.desc = params.get("desc") === "1";
  state.offset = Number(params.get("offset") || 0);
  const input = document.getElementById("filter");
  input.value = state.filter;
  let timer = null;
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { state.filter = input.value; state.offset = 0; load(); }, 300);
  });
  input.addEventListener("keydown", e => {
    if (e.key === "Enter") { clearTimeout(timer); state.filter = input.value; state.offset = 0; load(); }
  });
  document.getElementById("prev-page").addEventListener("click", () => { state.offset = Math.max(0, state.offset - LIMIT); load(); });
  document.getElementById("next-page").addEventListener("click", () => { state.offset += LIMIT; load(); });
  api(`/api/runs/${encodeURIComponent(RUN)}/steps`).then(body => {
    const select = document.getElementById("step-select");
    select.replaceChildren(...body.steps.map(s => el("option", {value: s}, s)));
    select.value = STEP;
    select.addEventListener("change", () => {
      location.href = `/runs/${encodeURIComponent(RUN)}/steps/${select.value}${location.search}`;
    });
  }).catch(() => {});
  if (params.get("group") !== null) showGroup(Number(params.get("group")));
  await load();
}

main().catch(err => console.error(err));

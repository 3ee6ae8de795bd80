// The runs page: one row per run (verb, task, status, steps, final metrics) and the config diff.
"use strict";

async function main() {
  nav();
  const data = await api("/api/runs");
  const cols = ["name", "verb", "task", "status", "steps"];
  const table = document.getElementById("runs-table");
  table.tHead.replaceChildren(el("tr", {}, el("th", {}, "#"), ...cols.map(c => el("th", {}, c)),
    ...data.final_columns.map(m => el("th", {}, m)), el("th", {}, "pages")));
  table.tBodies[0].replaceChildren(...data.runs.map(run => {
    const row = el("tr", {"data-run": run.index}, el("td", {}, run.index));
    for (const col of cols) {
      let content = run[col] === null || run[col] === undefined ? "" : run[col];
      if (col === "name") content = el("a", {href: `/metrics?runs=${run.index}`, title: run.path}, run.name);
      row.append(el("td", {"data-col": col, class: col === "status" ? `status-${run.status}` : null,
                           title: col === "status" ? run.status_reason : null}, content));
    }
    for (const m of data.final_columns) row.append(el("td", {"data-col": `metric:${m}`}, fmt(run.final[m])));
    const links = el("td", {});
    if (run.error) links.append(el("span", {class: "muted"}, run.error));
    else {
      links.append(el("a", {href: `/runs/${run.index}/reports`}, "reports"));
      if (run.logged_steps) links.append(" · ", el("a", {href: `/runs/${run.index}/steps/`, "data-steps": run.index},
                                                   `rollouts (${run.logged_steps} steps)`));
    }
    row.append(links);
    return row;
  }));
  const bad = data.runs.filter(r => r.error);
  if (bad.length) showError(bad.map(r => r.error).join("; "));
  for (const link of document.querySelectorAll("a[data-steps]")) {
    api(`/api/runs/${link.dataset.steps}/steps`).then(s => {
      if (s.steps.length) link.href = `/runs/${link.dataset.steps}/steps/${s.steps[s.steps.length - 1]}`;
    }).catch(() => {});
  }
  const diff = document.getElementById("config-diff");
  const names = data.config_runs.map(i => data.runs[i].name);
  diff.tHead.replaceChildren(el("tr", {}, el("th", {}, "key"), ...names.map(n => el("th", {}, n))));
  diff.tBodies[0].replaceChildren(...data.config_diff.map(d =>
    el("tr", {"data-key": d.key}, el("td", {}, d.key), ...d.values.map(v => el("td", {}, v === null ? "—" : v)))));
  if (!data.config_diff.length) diff.tBodies[0].append(el("tr", {}, el("td", {class: "muted"},
    names.length > 1 ? "the configs are the same" : "one run: nothing to compare")));
}

main().catch(err => console.error(err));

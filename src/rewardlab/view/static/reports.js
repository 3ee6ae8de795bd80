// A run's reports (rm eval, search: report.json; the summary) as tables and Plotly charts, and its plots.
"use strict";

const [, RUN] = pathParts();

async function main() {
  nav(RUN); navSteps(RUN);
  let body;
  try { body = await api(`/api/runs/${encodeURIComponent(RUN)}/reports`); }
  catch (err) { return; }
  const box = document.getElementById("reports");
  if (!body.reports.length) box.append(el("p", {class: "muted"}, "This run has no report."));
  for (const report of body.reports) {
    const section = el("section", {class: "report", "data-file": report.file}, el("h2", {}, `${report.file} (${report.kind})`));
    if (report.error) section.append(el("p", {class: "status-crashed"}, report.error));
    for (const chart of report.charts) {
      const div = el("div", {class: "report-chart", style: "width:100%;max-width:900px;height:420px"});
      section.append(div);
      const traces = chart.traces.map(t => ({x: t.x, y: t.y, name: t.name, type: chart.bar ? "bar" : "scatter",
                                             mode: "lines+markers", line: t.dash ? {dash: t.dash} : {}}));
      Plotly.newPlot(div, traces, {title: {text: chart.title}, margin: {t: 40},
        xaxis: {title: {text: chart.x_title}, type: chart.log_x ? "log" : "-"}, yaxis: {title: {text: chart.y_title}}},
        {displaylogo: false, responsive: true});
    }
    for (const table of report.tables) {
      section.append(el("h3", {}, table.title), el("table", {class: "report-table"},
        el("thead", {}, el("tr", {}, ...table.columns.map(c => el("th", {}, c)))),
        el("tbody", {}, ...table.rows.map(row => el("tr", {}, ...row.map(v => el("td", {}, fmt(v))))))));
    }
    box.append(section);
  }
  document.getElementById("plots").replaceChildren(...(body.plots.length ? [el("h2", {}, "Plots")] : []),
    ...body.plots.map(p => el("figure", {}, el("img", {src: `/runs/${encodeURIComponent(RUN)}/files/${p.split("/").map(encodeURIComponent).join("/")}`,
                                                      alt: p, style: "max-width:800px"}), el("figcaption", {}, p))));
}

main().catch(err => console.error(err));

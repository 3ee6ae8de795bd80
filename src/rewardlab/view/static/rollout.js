// One rollout: its tokens coloured by a per-token quantity, the loss mask, reasoning-step boundaries, and for an
// episode its turns (tool calls, results, turn reward and credit) and termination reason.
"use strict";

const [, RUN, , STEP, , INDEX] = pathParts();
// Diverging quantities are coloured green above their centre and red below; sequential ones blue by magnitude.
const SCALES = {advantages: {kind: "diverging", centre: 0}, ratio: {kind: "diverging", centre: 1},
                kl: {kind: "diverging", centre: 0}, clip: {kind: "sequential"},
                logprob: {kind: "sequential", flip: true}, entropy: {kind: "sequential"}};
let record = null;

/** The background colour of value `v` on `scale`, given the row's extent; null for a missing value. */
function colour(v, scale, extent) {
  if (v === null || v === undefined || !isFinite(v)) return null;
  if (scale.kind === "diverging") {
    const d = v - scale.centre;
    if (d === 0 || extent.maxAbs === 0) return "rgb(255, 255, 255)";
    const a = 0.15 + 0.85 * Math.min(1, Math.abs(d) / extent.maxAbs);
    const strong = Math.round(255 - 150 * a), weak = Math.round(255 - 40 * a);
    return d > 0 ? `rgb(${strong}, ${weak}, ${strong})` : `rgb(${weak}, ${strong}, ${strong})`;
  }
  const span = extent.max - extent.min;
  let a = span > 0 ? (v - extent.min) / span : 0;
  if (scale.flip) a = 1 - a;
  return `rgb(${Math.round(255 - 155 * a)}, ${Math.round(255 - 100 * a)}, 255)`;
}

function extentOf(values, scale) {
  const finite = (values || []).filter(v => v !== null && isFinite(v));
  return {maxAbs: Math.max(0, ...finite.map(v => Math.abs(v - (scale.centre || 0)))),
          min: Math.min(...finite), max: Math.max(...finite)};
}

function renderTokens() {
  const box = document.getElementById("tokens");
  const noTokens = document.getElementById("no-tokens");
  const by = document.getElementById("color-by").value;
  const tokens = record.tokens || (record.token_ids ? record.token_ids.map(String) : null);
  if (!tokens) {
    box.replaceChildren();
    box.hidden = true;
    noTokens.textContent = "This rollout has no per-token data (only the first rl.logging.log_tokens episodes of a " +
                           "step are logged token by token).";
    noTokens.hidden = false;
    return;
  }
  const values = record[by];
  const scale = SCALES[by];
  const extent = extentOf(values, scale);
  const mask = record.loss_mask || [];
  const bounds = new Map();
  const spans = record.step_spans || [];
  for (let k = 0; 2 * k < spans.length; k++) bounds.set(spans[2 * k], k);
  const nodes = [];
  tokens.forEach((text, i) => {
    if (bounds.has(i)) {
      const k = bounds.get(i);
      const score = record.step_scores ? record.step_scores[k] : null;
      nodes.push(el("span", {class: "step-boundary", "data-step": k, "data-score": score === null || score === undefined ? "" : score},
                    `step ${k + 1}${score === null || score === undefined ? "" : `: ${fmt(score)}`}`));
    }
    const v = values ? values[i] : null;
    const masked = mask[i] === 0;
    const bg = masked ? "rgb(238, 238, 238)" : colour(v, scale, extent);
    const title = [`#${i}`, `${by} ${fmt(v)}`, `loss_mask ${mask[i] ?? ""}`,
                   ...["advantages", "logprob", "logprob_old", "entropy", "ratio", "kl", "clip"]
                     .filter(k => k !== by && record[k]).map(k => `${k} ${fmt(record[k][i])}`)].join("\n");
    nodes.push(el("span", {class: masked ? "token masked" : "token", "data-i": i,
                           "data-value": v === null || v === undefined ? "" : String(v),
                           style: bg ? `background-color: ${bg}` : null, title}, text));
  });
  box.replaceChildren(...nodes);
  box.hidden = false;
  noTokens.hidden = true;
  document.getElementById("legend").textContent = values
    ? (scale.kind === "diverging" ? `green above ${scale.centre}, red below; strongest at |${by} - ${scale.centre}| = ${fmt(extent.maxAbs)}`
                                 : `blue: ${scale.flip ? "lower" : "higher"} ${by} (range ${fmt(extent.min)}..${fmt(extent.max)})`) +
      "; grey: not trained on (environment, tool or template tokens)"
    : `no ${by} values logged for this rollout`;
}

function renderTurns() {
  const box = document.getElementById("turns");
  const turns = record.turns || [];
  box.replaceChildren(...(turns.length ? [el("h2", {}, "Turns")] : []), ...turns.map((t, k) => el("div", {class: "turn", "data-turn": k},
    el("div", {}, `turn ${k + 1} · tokens ${t.span ? t.span.join("–") : ""} · reward ${fmt(t.reward)} · credit (advantage) ${fmt(t.advantage)}`),
    ...(t.tool_calls || []).map(c => el("div", {class: "tool-call", "data-status": c.status ?? ""},
      `tool ${c.name ?? "?"}(${typeof c.arguments === "string" ? c.arguments : JSON.stringify(c.arguments ?? "")})` +
      ` · ${c.status ?? ""}${c.seconds !== undefined && c.seconds !== null ? ` · ${fmt(c.seconds)} s` : ""}`)),
    t.result ? el("div", {class: "text tool-result"}, t.result) : null)));
  const term = document.getElementById("termination");
  term.textContent = record.termination ? `termination: ${record.termination}${record.truncated ? " (truncated)" : ""}` : "";
}

async function main() {
  nav(RUN); navSteps(RUN);
  document.querySelector("h1").textContent = `Rollout ${INDEX} of step ${STEP}`;
  try { record = await api(`/api/runs/${encodeURIComponent(RUN)}/steps/${encodeURIComponent(STEP)}/rollouts/${encodeURIComponent(INDEX)}`); }
  catch (err) { return; }
  const comps = Object.entries(record.components || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ");
  document.getElementById("meta").replaceChildren(
    el("div", {}, `reward ${fmt(record.reward)}${comps ? ` (${comps})` : ""} · advantage ${fmt(record.advantage)} · ` +
                  `group ${fmt(record.group)} · episode ${fmt(record.episode)} row ${fmt(record.row)} · kept ${fmt(record.kept)} · ` +
                  `staleness ${fmt(record.staleness)}`),
    record.error ? el("div", {class: "status-crashed"}, `reward error: ${record.error}`) : "",
    el("a", {href: `/runs/${encodeURIComponent(RUN)}/steps/${encodeURIComponent(STEP)}?group=${record.group}`}, "its group side by side"),
    " · ", el("a", {href: `/runs/${encodeURIComponent(RUN)}/prompts/${encodeURIComponent(record.prompt_key ?? "")}`}, "this prompt across steps"));
  document.getElementById("prompt").textContent = record.prompt ?? "";
  document.getElementById("completion").textContent = record.completion ?? "";
  const select = document.getElementById("color-by");
  const asked = new URLSearchParams(location.search).get("color");
  if (asked && SCALES[asked]) select.value = asked;
  select.addEventListener("change", renderTokens);
  renderTokens();
  renderTurns();
}

main().catch(err => console.error(err));

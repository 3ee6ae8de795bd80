// One prompt across steps: its group at every step that sampled it, to see what changed.
"use strict";

const [, RUN, , KEY] = pathParts();
const LIMIT = 20;
let offset = Number(new URLSearchParams(location.search).get("offset") || 0);

async function load() {
  let body;
  try { body = await api(`/api/runs/${encodeURIComponent(RUN)}/prompts/${encodeURIComponent(KEY)}?offset=${offset}&limit=${LIMIT}`); }
  catch (err) { return; }
  document.getElementById("prompt").textContent = body.prompt ?? "";
  document.getElementById("page-info").textContent =
    ` steps ${body.offset + 1}–${body.offset + body.steps.length} of ${body.steps_total} `;
  document.getElementById("prev-page").disabled = body.offset === 0;
  document.getElementById("next-page").disabled = body.offset + body.steps.length >= body.steps_total;
  document.getElementById("prompt-steps").replaceChildren(...body.steps.map(s => {
    const rewards = s.rollouts.map(r => r.reward).filter(v => v !== null);
    const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
    return el("section", {class: "prompt-step", "data-step": s.step},
      el("h2", {}, el("a", {href: `/runs/${encodeURIComponent(RUN)}/steps/${s.step}?group=${s.group}`}, `step ${s.step}`),
         ` · group ${s.group} · mean reward ${fmt(mean)}`),
      el("div", {class: "group-grid"}, ...s.rollouts.map(r => el("div", {class: "card", "data-index": r.index},
        el("a", {href: `/runs/${encodeURIComponent(RUN)}/steps/${s.step}/rollouts/${r.index}`}, `rollout ${r.index}`),
        el("div", {}, `reward ${fmt(r.reward)} · advantage ${fmt(r.advantage)} · kept ${fmt(r.kept)}`),
        el("div", {class: "text"}, r.completion ?? "")))));
  }));
}

async function main() {
  nav(RUN); navSteps(RUN);
  document.querySelector("h1").textContent = `Prompt ${KEY} across steps`;
  document.getElementById("prev-page").addEventListener("click", () => { offset = Math.max(0, offset - LIMIT); load(); });
  document.getElementById("next-page").addEventListener("click", () => { offset += LIMIT; load(); });
  await load();
}

main().catch(err => console.error(err));

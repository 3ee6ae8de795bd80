// Shared helpers of the viewer's pages. Data is always put into the page as text (textContent, attributes),
// never as HTML, so a completion holding <script> shows as text.
"use strict";

/** Create element `tag` with attributes `attrs` (class, data-*, ...) and children (strings become text nodes). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "style") node.style.cssText = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Show `message` (one line) in #error; an empty message hides it. */
function showError(message) {
  const box = document.getElementById("error");
  if (!box) return;
  box.textContent = message || "";
  box.hidden = !message;
}

/** GET `url` from the API as JSON; a 4xx/5xx puts the API's one-line error in #error and throws it. */
async function api(url) {
  let response;
  try {
    response = await fetch(url, {headers: {"Accept": "application/json"}});
  } catch (err) {
    showError(`the viewer is not reachable (${err})`);
    throw err;
  }
  const body = await response.json().catch(() => ({error: `${url}: ${response.status} without a JSON body`}));
  if (!response.ok) {
    showError(body.error || `${url}: HTTP ${response.status}`);
    throw new Error(body.error);
  }
  return body;
}

/** A number as a short string ("" for null). */
function fmt(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return String(value);
    return Math.abs(value) >= 1e4 || (value !== 0 && Math.abs(value) < 1e-3) ? value.toExponential(3)
      : value.toFixed(4).replace(/0+$/, "").replace(/\.$/, "");
  }
  if (typeof value === "boolean") return value ? "true" : "false";
  return String(value);
}

/** The path segments of the page's URL, decoded. */
function pathParts() {
  return location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
}

/** The top navigation bar: runs, metrics and, on a run's pages, its reports. */
function nav(run) {
  const bar = document.getElementById("nav");
  if (!bar) return;
  bar.replaceChildren(el("a", {href: "/runs"}, "runs"), " · ", el("a", {href: "/metrics"}, "metrics"));
  if (run !== undefined) {
    bar.append(" · ", el("a", {href: `/metrics?runs=${encodeURIComponent(run)}`}, `run ${run} metrics`),
               " · ", el("a", {href: `/runs/${encodeURIComponent(run)}/steps/`, id: "nav-steps"}, "rollouts"),
               " · ", el("a", {href: `/runs/${encodeURIComponent(run)}/reports`}, "reports"));
  }
}

/** Fill the run's "rollouts" nav link with its last logged step. */
async function navSteps(run) {
  const link = document.getElementById("nav-steps");
  if (!link) return;
  try {
    const steps = (await fetch(`/api/runs/${encodeURIComponent(run)}/steps`).then(r => r.json())).steps || [];
    if (steps.length) link.href = `/runs/${encodeURIComponent(run)}/steps/${steps[steps.length - 1]}`;
    else link.remove();
  } catch (err) { link.remove(); }
}

"""`rewardlab view` in a real browser: headless chromium (Debian's package, through Playwright) opens every page of the
viewer started on real runs (a short `train` run, a calculator run with tool calls, an `rm eval` report, and a copy of
the train run with a `<script>` completion injected) and checks that its charts and tables hold the runs' numbers,
that a token's colour follows its advantage's sign, that data shows as text, never as HTML; it saves a screenshot of
every page. Skipped, naming how to enable it, without chromium or Playwright (browser_fixtures.ENABLE)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import browser_fixtures as bf

pytestmark = [pytest.mark.skipif(bf.missing() is not None, reason=bf.missing() or ""),
              pytest.mark.xdist_group("browser")]

#: The order the runs are given to `rewardlab view` in (their index in its URLs).
ORDER = ("train", "calc", "rmeval", "xss")
TRAIN, CALC, RMEVAL, XSS = range(4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    return bf.make_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def url(runs, tmp_path_factory):
    with bf.viewer([runs[name] for name in ORDER], tmp_path_factory.mktemp("viewer") / "view.log") as base:
        yield base


@pytest.fixture(scope="module")
def context():
    with bf.browser_context() as ctx:
        yield ctx


class Page:
    """A browser tab that records console errors and uncaught exceptions."""

    def __init__(self, context, base: str) -> None:
        self.page, self.base, self.errors = context.new_page(), base, []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        self.page.on("response", lambda r: self.errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)

    def _console(self, msg) -> None:
        if msg.type == "error":
            self.errors.append(f"{msg.text} (at {msg.location.get('url')}:{msg.location.get('lineNumber')})")

    def open(self, path: str, ready: str | None = None):
        """Go to `path`, wait for the network to settle (and for selector `ready`); the page must answer < 400."""
        answer = self.page.goto(self.base + path, wait_until="networkidle")
        assert answer is not None and answer.status < 400, (path, answer and answer.status)
        if ready:
            self.page.wait_for_selector(ready, state="attached", timeout=15_000)
        return self.page

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def tab(context, url):
    page = Page(context, url)
    yield page
    page.close()
    assert page.errors == [], page.errors  # no test leaves a console error behind


def shown(text: str, value: float) -> bool:
    """Whether `text`, a number as the viewer prints it (4 decimals, or 4 significant digits in exponent form),
    shows `value`."""
    return abs(float(text) - value) <= max(5e-5, 5e-4 * abs(value))


def _cells(page, selector: str, col: str) -> list[str]:
    return page.eval_on_selector_all(f"{selector} td[data-col='{col}']", "els => els.map(e => e.textContent.trim())")


def _rollout_table(run: Path, step: int) -> list[dict]:
    from rewardlab import rollout_log

    return rollout_log.read_step(run, step).to_pylist()


def _rgb(css: str) -> tuple[int, int, int]:
    r, g, b = (int(float(x)) for x in re.findall(r"[\d.]+", css)[:3])
    return r, g, b


def _logged(run: Path, sign: int) -> tuple[int, int]:
    """(step, index) of the first token-logged rollout whose advantage has sign `sign`."""
    from rewardlab import rollout_log

    for step in rollout_log.logged_steps(run):
        for rec in _rollout_table(run, step):
            if rec["tokens"] is not None and rec["advantage"] is not None and rec["advantage"] * sign > 0:
                return step, rec["index"]
    raise AssertionError(f"{run}: no logged rollout with advantage of sign {sign}")


# --------------------------------------------------------------------------------------------------- every page
@pytest.fixture(scope="module")
def screenshots(context, url, runs, tmp_path_factory):
    """Every page opened once: {page name: (console errors, #error text, <h1> text, screenshot path)}."""
    from rewardlab import rollout_log

    key = _rollout_table(runs["train"], 1)[0]["prompt_key"]
    positive, negative = _logged(runs["train"], 1), _logged(runs["train"], -1)
    chart, table, tokens = "#metrics-chart .main-svg", "#rollouts-table tr[data-index]", "span.token"
    pages = {"root": ("/", "#runs-table tr[data-run]"), "runs": ("/runs", "#runs-table tr[data-run]"),
             "metrics": ("/metrics?runs=0,1,3&metric=reward/mean", chart),
             "run_metrics": (f"/runs/{TRAIN}/metrics", chart),
             "steps": (f"/runs/{TRAIN}/steps/2", table), "env_steps": (f"/runs/{CALC}/steps/2", table),
             "rollout_positive": (f"/runs/{TRAIN}/steps/{positive[0]}/rollouts/{positive[1]}", tokens),
             "rollout_negative": (f"/runs/{TRAIN}/steps/{negative[0]}/rollouts/{negative[1]}", tokens),
             "rollout_no_tokens": (f"/runs/{TRAIN}/steps/1/rollouts/7", "#no-tokens:not([hidden])"),
             "episode": (f"/runs/{CALC}/steps/1/rollouts/0", "#turns .turn"),
             "xss_rollout": (f"/runs/{XSS}/steps/1/rollouts/0", tokens),
             "prompt": (f"/runs/{TRAIN}/prompts/{key}", "#prompt-steps .prompt-step"),
             "train_reports": (f"/runs/{TRAIN}/reports", "#plots img"),
             "rm_reports": (f"/runs/{RMEVAL}/reports", "table.report-table")}
    assert rollout_log.read_step(runs["train"], 1)["tokens"][7].as_py() is None  # the no-tokens page's record
    folder = tmp_path_factory.mktemp("screenshots")
    seen = {}
    for name, (path, ready) in pages.items():
        tab = Page(context, url)
        page = tab.open(path, ready)
        page.wait_for_timeout(200)  # Plotly finishes drawing
        shot = folder / f"{name}.png"
        page.screenshot(path=str(shot), full_page=True)
        seen[name] = (list(tab.errors), page.text_content("#error") or "", page.text_content("h1") or "",
                      page.url, shot)
        tab.close()
    return seen


def test_every_page_opens_without_errors(screenshots):
    for name, (errors, error_box, h1, _, _) in screenshots.items():
        assert errors == [], (name, errors)
        assert error_box.strip() == "", (name, error_box)
        assert h1.strip(), name
    assert screenshots["root"][3].endswith("/runs")  # / redirects to the runs page


def test_screenshots_are_saved(screenshots):
    for name, (*_, shot) in screenshots.items():
        assert shot.is_file() and shot.stat().st_size > 1000, name
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_json_api_answers_with_the_runs_numbers(context, url, runs):
    api = context.request
    listed = api.get(f"{url}/api/runs").json()["runs"]
    assert [r["name"] for r in listed] == list(ORDER)
    metrics = api.get(f"{url}/api/runs/{TRAIN}/metrics").json()
    records = bf.read_metrics(runs["train"])
    assert [m["step"] for m in metrics["records"]] == [r["step"] for r in records]
    assert api.get(f"{url}/api/runs/{TRAIN}/steps").json()["steps"] == [1, 2, 3]
    table = api.get(f"{url}/api/runs/{TRAIN}/steps/2/rollouts").json()
    assert [r["reward"] for r in table["rows"]] == [r["reward"] for r in _rollout_table(runs["train"], 2)]
    rec = api.get(f"{url}/api/runs/{TRAIN}/steps/2/rollouts/0").json()
    assert rec["tokens"] == _rollout_table(runs["train"], 2)[0]["tokens"]
    missing = api.get(f"{url}/api/runs/{TRAIN}/steps/99/rollouts")
    assert missing.status == 404 and "error" in missing.json()


# --------------------------------------------------------------------------------------------------- runs page
def test_runs_table_holds_each_runs_steps_and_final_metrics(tab, runs):
    page = tab.open("/runs", "#runs-table tr[data-run]")
    assert page.eval_on_selector_all("#runs-table tr[data-run]", "els => els.map(e => e.dataset.run)") == \
        [str(i) for i in range(len(ORDER))]
    for i, name in enumerate(ORDER):
        row = f"#runs-table tr[data-run='{i}']"
        assert _cells(page, row, "name") == [name]
        if name == "rmeval":
            continue
        last = bf.read_metrics(runs[name])[-1]
        assert _cells(page, row, "steps") == [str(last["step"])]
        shown_metrics = page.eval_on_selector_all(
            f"{row} td[data-col^='metric:']", "els => els.map(e => [e.dataset.col.slice(7), e.textContent.trim()])")
        compared = [(m, text) for m, text in shown_metrics if text]
        assert any(m == "reward/mean" for m, _ in compared), shown_metrics
        for metric, text in compared:
            assert shown(text, last[metric]), (name, metric, text, last[metric])
    assert _cells(page, f"#runs-table tr[data-run='{TRAIN}']", "verb") == ["train"]
    # the config diff: the calculator run's task differs from the train run's
    keys = page.eval_on_selector_all("#config-diff tr[data-key]", "els => els.map(e => e.dataset.key)")
    assert any(k.startswith("task") for k in keys), keys
    page.click(f"#runs-table tr[data-run='{CALC}'] td[data-col='name'] a")
    page.wait_for_selector("#metrics-chart .main-svg", timeout=15_000)
    assert "/metrics" in page.url


# --------------------------------------------------------------------------------------------------- metrics page
def _traces(page) -> list[dict]:
    return page.evaluate("""() => (document.getElementById('metrics-chart').data || [])
        .map(t => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y)}))""")


def _set(page, selector: str, value: str) -> None:
    page.fill(selector, value)
    page.dispatch_event(selector, "change")


def test_metrics_chart_plots_the_metrics_files_values(tab, runs):
    page = tab.open(f"/metrics?runs={TRAIN},{CALC}&metric=reward/mean", "#metrics-chart .main-svg")
    _set(page, "#smoothing", "0")
    for metric in ("reward/mean", "policy/entropy"):
        page.select_option("#metric-select", metric)
        page.wait_for_function(f"() => (document.getElementById('metrics-chart').data || []).length == 2 && "
                               f"document.getElementById('metric-select').value == {json.dumps(metric)}")
        page.wait_for_timeout(200)
        traces = _traces(page)
        assert [t["name"] for t in traces] == ["train", "calc"]
        for trace, name in zip(traces, ("train", "calc")):
            records = [r for r in bf.read_metrics(runs[name]) if r.get(metric) is not None]
            assert trace["x"] == [r["step"] for r in records]
            assert trace["y"] == pytest.approx([r[metric] for r in records], rel=1e-9, abs=1e-12), (name, metric)
    page.check("#log-scale")
    page.wait_for_function("() => document.getElementById('metrics-chart').layout.yaxis.type === 'log'")


def test_smoothing_changes_the_plotted_values(tab, runs):
    page = tab.open(f"/runs/{TRAIN}/metrics", "#metrics-chart .main-svg")
    _set(page, "#smoothing", "0")
    page.select_option("#metric-select", "reward/mean")
    page.wait_for_timeout(300)
    raw = [r["reward/mean"] for r in bf.read_metrics(runs["train"])]
    assert _traces(page)[0]["y"] == pytest.approx(raw)
    _set(page, "#smoothing", "0.9")
    page.wait_for_timeout(300)
    smoothed = _traces(page)[0]["y"]
    assert smoothed[0] == pytest.approx(raw[0]) and smoothed != pytest.approx(raw)


# --------------------------------------------------------------------------------------------------- step page
def test_rollouts_table_holds_the_rollouts_file_and_sorts_and_filters(tab, runs):
    records = _rollout_table(runs["train"], 2)
    page = tab.open(f"/runs/{TRAIN}/steps/2", "#rollouts-table tr[data-index]")
    rows = page.eval_on_selector_all(
        "#rollouts-table tr[data-index]",
        "els => els.map(e => [Number(e.dataset.index), e.querySelector(\"td[data-col='reward']\").textContent])")
    assert sorted(i for i, _ in rows) == [r["index"] for r in records]
    for index, text in rows:
        assert shown(text, records[index]["reward"]), (index, text)
    for col in ("reward/chrf", "reward/lower", "advantage", "group", "kept", "termination", "staleness"):
        assert page.query_selector(f"#rollouts-table td[data-col='{col}']") is not None, col
    for rec in records:
        for component in ("reward/chrf", "reward/lower", "advantage"):
            cell = _cells(page, f"#rollouts-table tr[data-index='{rec['index']}']", component)
            assert len(cell) == 1 and shown(cell[0], rec[component]), (rec["index"], component, cell)
    # sorting by reward, then filtering
    page.click("#rollouts-table th[data-col='reward']")
    page.wait_for_timeout(200)
    shown_rewards = [float(t) for t in _cells(page, "#rollouts-table", "reward")]
    assert shown_rewards in (sorted(shown_rewards), sorted(shown_rewards, reverse=True))
    cut = sorted(r["reward"] for r in records)[len(records) // 2]
    _set(page, "#filter", f"reward>{cut}")
    page.keyboard.press("Enter")
    page.wait_for_timeout(300)
    kept = sorted(int(i) for i in page.eval_on_selector_all("#rollouts-table tr[data-index]",
                                                            "els => els.map(e => e.dataset.index)"))
    assert kept == [r["index"] for r in records if r["reward"] > cut]
    # a row opens its rollout page
    first = kept[0]
    page.click(f"#rollouts-table tr[data-index='{first}'] td[data-col='reward']")
    page.wait_for_url(f"**/runs/{TRAIN}/steps/2/rollouts/{first}", timeout=15_000)
    page.wait_for_selector("#completion", timeout=15_000)


def test_step_select_switches_steps(tab, runs):
    page = tab.open(f"/runs/{TRAIN}/steps/1", "#rollouts-table tr[data-index]")
    assert page.eval_on_selector_all("#step-select option", "els => els.map(e => e.value)") == ["1", "2", "3"]
    page.select_option("#step-select", "3")
    page.wait_for_url(f"**/runs/{TRAIN}/steps/3*", timeout=15_000)
    page.wait_for_selector("#rollouts-table tr[data-index]")
    records = _rollout_table(runs["train"], 3)
    texts = dict(page.eval_on_selector_all("#rollouts-table tr[data-index]", """els => els.map(e =>
        [e.dataset.index, e.querySelector("td[data-col='reward']").textContent])"""))
    assert all(shown(texts[str(r["index"])], r["reward"]) for r in records)


def test_group_view_shows_a_groups_rollouts_side_by_side(tab, runs):
    records = _rollout_table(runs["train"], 2)
    group = records[0]["group"]
    members = [r["index"] for r in records if r["group"] == group]
    page = tab.open(f"/runs/{TRAIN}/steps/2", "#rollouts-table tr[data-index]")
    page.click("#rollouts-table tr[data-index='0'] td[data-col='group'] button")
    page.wait_for_selector("#group-view:not([hidden]) .card", timeout=15_000)
    cards = page.eval_on_selector_all("#group-view .card",
                                      "els => els.map(e => [Number(e.dataset.index), e.textContent])")
    assert [i for i, _ in cards] == members
    for index, text in cards:
        reward = re.search(r"reward (\S+)", text).group(1)
        assert shown(reward, records[index]["reward"]), (index, text)
    assert "/rollouts/" not in page.url  # the group button does not open the row's rollout


# --------------------------------------------------------------------------------------------------- rollout page
def _tokens(page) -> list[dict]:
    return page.eval_on_selector_all("span.token", """els => els.map(e => ({i: Number(e.dataset.i),
        value: e.dataset.value, masked: e.classList.contains('masked'), text: e.textContent,
        background: getComputedStyle(e).backgroundColor}))""")


@pytest.mark.parametrize("sign", [1, -1])
def test_token_colour_follows_the_advantages_sign(tab, runs, sign):
    step, index = _logged(runs["train"], sign)
    rec = _rollout_table(runs["train"], step)[index]
    page = tab.open(f"/runs/{TRAIN}/steps/{step}/rollouts/{index}", "span.token")
    tokens = _tokens(page)
    assert [t["i"] for t in tokens] == list(range(len(rec["tokens"])))
    assert "".join(t["text"] for t in tokens) == "".join(rec["tokens"])
    coloured = 0
    for t in tokens:
        adv, mask = rec["advantages"][t["i"]], rec["loss_mask"][t["i"]]
        assert float(t["value"]) == pytest.approx(adv, rel=1e-5, abs=1e-6)
        assert t["masked"] == (mask == 0)
        if mask == 1 and adv != 0:
            r, g, _ = _rgb(t["background"])
            assert (g > r) if adv > 0 else (r > g), (t, adv)
            coloured += 1
    assert coloured > 0
    # colour by ratio: the values become the ratios the loss used
    page.select_option("#color-by", "ratio")
    page.wait_for_timeout(200)
    for t in _tokens(page):
        assert float(t["value"]) == pytest.approx(rec["ratio"][t["i"]], rel=1e-5), t


def test_a_rollout_without_token_data_says_so(tab, runs):
    rec = _rollout_table(runs["train"], 1)[7]
    assert rec["tokens"] is None
    page = tab.open(f"/runs/{TRAIN}/steps/1/rollouts/7", "#completion")
    page.wait_for_selector("#no-tokens:not([hidden])", timeout=15_000)
    assert page.query_selector("span.token") is None
    assert rec["completion"] in page.text_content("#completion")


def test_an_episode_shows_its_turns_tool_calls_and_masked_tool_tokens(tab, runs):
    rec = _rollout_table(runs["calc"], 1)[0]
    turns = json.loads(rec["turns"])
    calls = [c for turn in turns for c in turn["tool_calls"]]
    assert any(c["status"] == "ok" for c in calls), turns  # the fixture's model calls the tool
    page = tab.open(f"/runs/{CALC}/steps/1/rollouts/0", "#turns .turn")
    texts = page.eval_on_selector_all("#turns .turn", "els => els.map(e => e.textContent)")
    assert len(texts) == len(turns)
    for turn, text in zip(turns, texts):
        for call in turn["tool_calls"]:
            assert call["status"] in text
            if call["status"] == "ok":
                assert call["name"] in text and call["arguments"]["expression"] in text
        if turn["result"]:
            assert turn["result"] in text  # the tool's "<o>...</o>" shows as text
    assert rec["termination"] in page.text_content("#termination")
    tokens = _tokens(page)
    masked = [t["i"] for t in tokens if t["masked"]]
    assert masked == [i for i, m in enumerate(rec["loss_mask"]) if m == 0] and masked  # the tool result's tokens


def test_html_in_the_data_shows_as_text(tab, runs):
    from rewardlab import rollout_log

    rec = rollout_log.read_rollout(runs["xss"], 1, 0)
    assert rec["completion"] == bf.XSS
    page = tab.open(f"/runs/{XSS}/steps/1/rollouts/0", "#completion")
    page.wait_for_timeout(300)
    assert bf.XSS in page.text_content("#completion")
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.query_selector("#completion script, #tokens script, #prompt script") is None
    # the rollouts table and a prompt that holds the same element
    page = tab.open(f"/runs/{XSS}/steps/1", "#rollouts-table tr[data-index]")
    page.wait_for_timeout(300)
    assert bf.XSS in page.text_content("#rollouts-table tr[data-index='0'] td[data-col='completion']")
    assert page.evaluate("typeof window.__xss") == "undefined"
    xss_prompt = next(r for step in (1, 2, 3) for r in _rollout_table(runs["train"], step) if bf.XSS in r["prompt"])
    page = tab.open(f"/runs/{TRAIN}/steps/{xss_prompt['step']}/rollouts/{xss_prompt['index']}", "#prompt")
    page.wait_for_timeout(300)
    assert bf.XSS in page.text_content("#prompt")
    assert page.evaluate("typeof window.__xss") == "undefined"


# --------------------------------------------------------------------------------------------------- other pages
def test_prompt_page_lists_the_steps_that_drew_the_prompt(tab, runs):
    from rewardlab import rollout_log

    key = _rollout_table(runs["train"], 1)[0]["prompt_key"]
    steps = [s for s in rollout_log.logged_steps(runs["train"])
             if key in rollout_log.read_step(runs["train"], s, columns=["prompt_key"])["prompt_key"].to_pylist()]
    page = tab.open(f"/runs/{TRAIN}/prompts/{key}", "#prompt-steps .prompt-step")
    assert page.eval_on_selector_all("#prompt-steps .prompt-step", "els => els.map(e => Number(e.dataset.step))") \
        == steps


def _leaves(section: dict, prefix: str = "") -> dict[str, object]:
    """The scalar leaves of a report section, keyed by their dotted path."""
    out = {}
    for key, value in section.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        elif not isinstance(value, list):
            out[f"{prefix}{key}"] = value
    return out


def test_reports_page_shows_the_rm_eval_report(tab, runs):
    report = json.loads((runs["rmeval"] / "report.json").read_text())
    page = tab.open(f"/runs/{RMEVAL}/reports", "table.report-table")
    tables = page.eval_on_selector_all("table.report-table", """els => els.map(t => Array.from(t.tBodies[0].rows)
        .map(r => Array.from(r.cells).map(c => c.textContent.trim())))""")
    pairs = {row[0]: row[1] for table in tables for row in table if len(row) == 2}
    expected = _leaves({k: v for k, v in report["pairs"].items() if k != "per_subset"})
    assert expected["accuracy"] == 0.6 and expected["ties"] == 1  # the fixture's pairs: 3 of 5 right, one tie
    for key, value in expected.items():
        key = key.rstrip(".")  # the viewer's dotted keys drop a trailing dot (the master key "", "... step.")
        assert key in pairs, (key, sorted(pairs))
        if isinstance(value, bool) or value is None:
            continue
        assert shown(pairs[key], value), (key, pairs[key], value)
    text = page.text_content("body")
    for subset in report["pairs"]["per_subset"]["subsets"]:
        assert subset in text
    # the per-subset chart plots each subset's accuracy
    page.wait_for_selector("div.report-chart .main-svg")
    charts = page.evaluate("""() => Array.from(document.querySelectorAll('div.report-chart'))
        .map(d => d.data.map(t => ({x: Array.from(t.x), y: Array.from(t.y)})))""")
    subsets = report["pairs"]["per_subset"]["subsets"]
    plotted = {x: y for chart in charts for trace in chart for x, y in zip(trace["x"], trace["y"]) if x in subsets}
    assert plotted == {name: pytest.approx(v["mean"]) for name, v in subsets.items()}, charts

"""The `rewardlab view` web app: static pages (`static/*.html`, vanilla JS that renders with DOM text nodes) over a
read-only JSON API (`/api/...`, docs/viewer.md).

Pages never interpolate data server-side: a page route checks that the run (and step, rollout) it names exists and
answers the page's static HTML with 200, or with the same HTML and a 4xx status when it does not; the page's script
fetches the API and shows the API's one-line error in `#error`. Only GET (and HEAD) is routed: PUT, POST, DELETE and
PATCH are answered 405. Errors are JSON `{"error": "one line"}` with a 4xx status; an unexpected failure is a one-line
JSON 500, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rewardlab.view import data
from rewardlab.view.data import Run, ViewError

STATIC = Path(__file__).parent / "static"
#: Headers on every response: no caching of data, no sniffing, scripts only from this server.
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
           "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                      "script-src 'self' 'unsafe-eval'"}


def plotly_js() -> Path:
    """The plotly.min.js the installed `plotly` package ships (`plotly/package_data/plotly.min.js`)."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


class JSON(JSONResponse):
    """Strict JSON (non-finite floats are None) with `HEADERS`."""

    def render(self, content: Any) -> bytes:
        return json.dumps(data.finite(content), ensure_ascii=False, allow_nan=False, default=str,
                          separators=(",", ":")).encode("utf-8")


def _error(message: str, status: int) -> JSON:
    return JSON({"error": message}, status_code=status, headers=HEADERS)


def _int(request: Request, name: str, default: int | None = None) -> int:
    """Query or path parameter `name` as an int.

    Raises:
        ViewError (400): not an integer (names it).
    """
    raw = request.path_params.get(name, request.query_params.get(name))
    if raw is None:
        if default is None:
            raise ViewError(f"{name} is required", 400)
        return default
    try:
        return int(raw)
    except ValueError:
        raise ViewError(f"{name} must be an integer, not {raw!r}", 400) from None


def _prefetch(runs: Sequence[Run]) -> None:
    """Build each readable run's prompt index (`data.prompt_index`); a run that fails is left for its request."""
    for run in runs:
        if not run.error:
            try:
                data.prompt_index(run)
            except Exception:  # noqa: BLE001 - the request that needs it reports the problem
                pass


def create_app(run_dirs: Sequence[str | Path], *, quiet: bool = False) -> Starlette:
    """The viewer's Starlette app over `run_dirs` (each a run directory or a directory to search for runs).
    A path that is missing or holds no run is listed with its error (and printed to stderr unless `quiet`)."""
    runs = data.find_runs(run_dirs)
    if not quiet:
        for run in runs:
            if run.error:
                print(f"rewardlab view: warning: {run.error}", file=sys.stderr)

    def run_of(request: Request) -> Run:
        return data.get_run(runs, request.path_params["run"])

    def api(fn):
        """A GET endpoint answering `fn(request)` as JSON; ViewError -> its status and one line."""
        async def endpoint(request: Request) -> Response:
            try:
                return JSON(fn(request), headers=HEADERS)
            except ViewError as exc:
                return _error(str(exc), exc.status)
            except Exception as exc:  # noqa: BLE001 - one line, never a traceback
                return _error(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", 500)
        return endpoint

    def page(name: str, check=None):
        """A GET endpoint answering static/`name`: 200, or the 4xx of `check(request)`'s ViewError (the page's
        script then shows the API's message)."""
        html = STATIC / name

        async def endpoint(request: Request) -> Response:
            status = 200
            if check is not None:
                try:
                    check(request)
                except ViewError as exc:
                    status = exc.status
                    print(f"rewardlab view: {request.url.path}: {exc}", file=sys.stderr)
            return FileResponse(html, status_code=status, media_type="text/html; charset=utf-8", headers=HEADERS)
        return endpoint

    def check_step(request: Request) -> None:
        data.step_rows(run_of(request), _int(request, "step"))

    def check_rollout(request: Request) -> None:
        data.rollout_record(run_of(request), _int(request, "step"), _int(request, "index"))

    def check_run(request: Request) -> None:
        run_of(request).check()

    def check_metrics(request: Request) -> None:
        for key in filter(None, request.query_params.get("runs", "").split(",")):
            data.get_run(runs, key).check()

    async def file_endpoint(request: Request) -> Response:
        try:
            path, media = data.run_file(run_of(request), request.path_params["path"])
        except ViewError as exc:
            return _error(str(exc), exc.status)
        return FileResponse(path, media_type=media, headers=HEADERS)

    async def plotly(request: Request) -> Response:
        return FileResponse(plotly_js(), media_type="text/javascript", headers=HEADERS)

    async def favicon(request: Request) -> Response:
        return Response(status_code=204, headers=HEADERS)

    async def root(request: Request) -> Response:
        return RedirectResponse("/runs", status_code=307)

    async def run_metrics_page(request: Request) -> Response:
        try:
            run = run_of(request)
        except ViewError as exc:
            return _error(str(exc), exc.status)
        return RedirectResponse(f"/metrics?runs={run.index}", status_code=307)

    async def last_step_page(request: Request) -> Response:
        try:
            run = run_of(request)
            run.check()
        except ViewError as exc:
            return _error(str(exc), exc.status)
        steps = sorted(data.step_files(run))
        if not steps:
            return _error(f"run {run.name} has no rollouts files (rl.logging.log_completions)", 404)
        return RedirectResponse(f"/runs/{run.index}/steps/{steps[-1]}", status_code=307)

    def step_list(request: Request) -> dict[str, Any]:
        run = run_of(request)
        run.check()
        return {"run": run.index, "steps": sorted(data.step_files(run))}

    def rollouts(request: Request) -> dict[str, Any]:
        q = request.query_params
        return data.rollouts_page(run_of(request), _int(request, "step"), offset=_int(request, "offset", 0),
                                  limit=_int(request, "limit", 100), sort=q.get("sort") or None,
                                  desc=q.get("desc", "0").lower() in ("1", "true"), filter_text=q.get("filter", ""))

    routes = [
        Route("/", root),
        Route("/runs", page("runs.html")),
        Route("/metrics", page("metrics.html", check_metrics)),
        Route("/runs/{run}/metrics", run_metrics_page),
        Route("/runs/{run}/steps", last_step_page),
        Route("/runs/{run}/steps/", last_step_page),
        Route("/runs/{run}/steps/{step}", page("step.html", check_step)),
        Route("/runs/{run}/steps/{step}/rollouts/{index}", page("rollout.html", check_rollout)),
        Route("/runs/{run}/prompts/{key}", page("prompt.html", check_run)),
        Route("/runs/{run}/reports", page("reports.html", check_run)),
        Route("/runs/{run}/files/{path:path}", file_endpoint),
        Route("/plotly.min.js", plotly),
        Route("/favicon.ico", favicon),
        Route("/api/runs", api(lambda r: data.runs_overview(runs))),
        Route("/api/runs/{run}", api(lambda r: data.run_info(run_of(r)))),
        Route("/api/runs/{run}/metrics", api(lambda r: data.read_metrics(run_of(r), _int(r, "since", 0)))),
        Route("/api/runs/{run}/steps", api(step_list)),
        Route("/api/runs/{run}/steps/{step}/rollouts", api(rollouts)),
        Route("/api/runs/{run}/steps/{step}/rollouts/{index}",
              api(lambda r: data.rollout_record(run_of(r), _int(r, "step"), _int(r, "index")))),
        Route("/api/runs/{run}/steps/{step}/groups/{group}",
              api(lambda r: data.group_rollouts(run_of(r), _int(r, "step"), _int(r, "group")))),
        Route("/api/runs/{run}/prompts/{key}",
              api(lambda r: data.prompt_steps(run_of(r), r.path_params["key"], offset=_int(r, "offset", 0),
                                              limit=_int(r, "limit", 20)))),
        Route("/api/runs/{run}/reports", api(lambda r: data.reports(run_of(r)))),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(f"no page {request.url.path}", 404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error(f"{request.method} is refused: the viewer is read-only", 405)

    async def server_error(request: Request, exc: Exception) -> Response:
        return _error(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", 500)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        """When served: build the runs' prompt indexes in a background thread, so the first prompt page is fast."""
        threading.Thread(target=_prefetch, args=(runs,), name="rewardlab-view-prefetch", daemon=True).start()
        yield

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed, 500: server_error},
                    lifespan=lifespan)
    app.state.runs = runs
    return app

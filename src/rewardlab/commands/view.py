"""`rewardlab view RUN_DIR [RUN_DIR ...] [--port P] [--host H]`: the local web viewer of run directories.

It has no config file: the run directories (or directories to search for runs) are positional. It serves
`rewardlab.view.create_app` with uvicorn on 127.0.0.1 (unless --host), prints the URL and exits 0 on Ctrl-C. Without
the `view` extra it says in one line which extra to install and exits 2. It writes nothing (docs/viewer.md).
"""

from __future__ import annotations

import argparse
import sys

#: One line for `rewardlab --help`.
HELP = "local web viewer of run directories: runs, metric curves, rollouts token by token, reports (read-only)"
DEFAULT_PORT = 8765
DEFAULT_HOST = "127.0.0.1"


def parser() -> argparse.ArgumentParser:
    """The verb's argument parser (`rewardlab view --help`)."""
    p = argparse.ArgumentParser(prog="rewardlab view", description=HELP)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="a run directory, or a directory whose runs (up to 4 levels down) are shown")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to bind (default {DEFAULT_HOST}: this machine only; the viewer has no login)")
    return p


def main(argv: list[str]) -> int:
    """Run the viewer until Ctrl-C: 0 then, 2 on a bad command line, a missing extra or a port in use."""
    args = parser().parse_args(argv)
    from rewardlab.view import missing

    absent = missing()
    if absent:
        print(f"rewardlab view: error: needs pip install 'rewardlab[view]' (missing {', '.join(absent)})",
              file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"rewardlab view: error: --port must be in 1..65535, not {args.port}", file=sys.stderr)
        return 2
    import uvicorn

    from rewardlab.view import create_app

    problem = _bind_problem(args.host, args.port)
    if problem:
        print(f"rewardlab view: error: cannot serve on {args.host}:{args.port} ({problem})", file=sys.stderr)
        return 2
    app = create_app(args.runs)
    shown = [r for r in app.state.runs if not r.error]
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"rewardlab view: {len(shown)} run(s) at http://{host}:{args.port}/  (Ctrl-C to stop)", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                           access_log=False))
    try:
        server.run()
    except KeyboardInterrupt:
        return 0
    except SystemExit:  # uvicorn exits when it cannot bind (a race with another process)
        print(f"rewardlab view: error: cannot serve on {args.host}:{args.port}", file=sys.stderr)
        return 2
    return 0


def _bind_problem(host: str, port: int) -> str | None:
    """Why `host`:`port` cannot be bound (in use, no such address), or None when it can."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return exc.strerror or str(exc)
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None

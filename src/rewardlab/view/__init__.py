"""`rewardlab view`: a local, read-only web viewer of run directories (docs/viewer.md).

`create_app(run_dirs)` builds the Starlette app (`rewardlab.view.app`); `rewardlab.view.data` reads the runs. Both need
the `view` extra (starlette, uvicorn, plotly): this package's `__init__` imports neither, so that the CLI can say
which extra to install.
"""

from __future__ import annotations

from typing import Any

#: The packages of the `view` extra, as imported.
REQUIRED = ("starlette", "uvicorn", "plotly")


def missing() -> list[str]:
    """The `view` extra's packages that are not installed (import names)."""
    import importlib.util

    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def create_app(run_dirs: Any, **kwargs: Any):
    """`rewardlab.view.app.create_app`, imported when called."""
    from rewardlab.view.app import create_app as build

    return build(run_dirs, **kwargs)

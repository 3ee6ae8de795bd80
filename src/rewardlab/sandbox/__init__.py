"""The OS sandbox: run untrusted Python programs contained (namespaces, rlimits, seccomp, Landlock, wall timeout).

A layer below the rewards: it imports nothing of rewardlab. `runner` is the caller's side (`Sandbox`), `launcher`
the stdlib-only process it starts by path to fork one contained process tree per program. User documentation:
docs/sandbox.md.
"""

from rewardlab.sandbox.runner import (
    ISOLATION,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    default_workers,
)

__all__ = ["ISOLATION", "Sandbox", "SandboxError", "SandboxLimits", "SandboxResult", "default_workers"]

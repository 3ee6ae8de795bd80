"""The candidate's side of the strict harness: a fresh interpreter that runs the program and answers the tests'
requests over two pipes (fd 3 in: marshal, written by the tests' side; fd 4 out: JSON). It runs with -S, its
import path (site-packages included) given by the tests' side. It never sees a test, an expected value or the run's
key; whatever it or the program does here can change only the values it answers with (see
rewardlab.rewards.code_strict).

Requests and replies (codec messages):
    ["load", program, work_dir, path]   -> ["loaded", [global names]] | ["load_failed", kind, why]
    ["call", seq, target, args, kwargs] -> ["ok", seq, value, mutated] | ["raise", seq, type name, message]
    ["getattr", seq, target, name]      -> the same
`target` is ["global", name] or ["ref", id]; `mutated` is [[position or keyword, value], ...] for the list, dict,
set and bytearray arguments whose contents the call changed. Requires codec.py's functions in its globals.
"""

import builtins as _rl_builtins
import marshal as _rl_marshal
import sys as _rl_sys

_RL_IN, _RL_OUT = 3, 4
_rl_handles = {}
_rl_namespace = {}


def _rl_handle(obj):
    key = len(_rl_handles) + 1
    _rl_handles[key] = obj
    return ["handle", key, type(obj).__name__[:100]]


def _rl_resolve(tag, fields):
    if tag == "ref" and len(fields) == 1 and fields[0] in _rl_handles:
        return _rl_handles[fields[0]]
    if tag == "global" and len(fields) == 1 and fields[0] in _rl_namespace:
        return _rl_namespace[fields[0]]
    raise ValueError("unknown reference %r" % (fields,))


def _rl_why(exc):
    try:
        text = str(exc)
    except BaseException:
        text = ""
    return " ".join(text.split())[:200]


def _rl_load(program, work, path):
    _rl_sys.path[:] = [work] + [p for p in path if type(p) is str]
    _rl_namespace.update({"__name__": "__main__", "__builtins__": _rl_builtins})
    try:
        exec(compile(program, "solution.py", "exec"), _rl_namespace)
    except BaseException as exc:
        return ["load_failed", "error", type(exc).__name__ + ": " + _rl_why(exc)]
    names = [n for n in _rl_namespace if type(n) is str and n.isidentifier() and not n.startswith("__")]
    return ["loaded", names[:10000]]


def _rl_serve():
    send(_RL_OUT, dumps(["ready"]))
    while True:
        request = _rl_marshal.loads(recv(_RL_IN))
        if request[0] == "load":
            send(_RL_OUT, dumps(_rl_load(request[1], request[2], request[3])))
            continue
        op, seq = request[0], request[1]
        try:
            target = decode(request[2], _rl_resolve)
            if op == "call":
                args = decode(request[3], _rl_resolve)
                kwargs = decode(request[4], _rl_resolve)
                before = [encode(a, _rl_handle) if type(a) in (list, dict, set, bytearray) else None for a in args]
                value = target(*args, **kwargs)
                mutated = []
                for i, a in enumerate(args):
                    if before[i] is not None:
                        after = encode(a, _rl_handle)
                        if after != before[i]:
                            mutated.append([i, after])
            else:
                value, mutated = getattr(target, request[3]), []
            reply = dumps(["ok", seq, encode(value, _rl_handle), mutated])
        except BaseException as exc:
            reply = dumps(["raise", seq, type(exc).__name__[:100], _rl_why(exc)])
        send(_RL_OUT, reply)


_rl_serve()

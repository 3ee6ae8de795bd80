"""Plain values on the wire between the strict harness's two processes (stdlib only; its text is also sent into the
sandbox, prepended to both sides' programs, so it must not import rewardlab).

A value is plain when its type is exactly one of None, bool, int, float, complex, str, bytes, bytearray, list, tuple,
dict, set, frozenset, range, fractions.Fraction, decimal.Decimal (subclasses are not plain), and a container is plain
when everything in it is. A numpy bool, integer or floating scalar is sent as its Python value (`.item()`). In a message (requests: marshal, written by the tests' side; replies: JSON with NaN and
infinities, written by the candidate's side and parsed by json) a plain scalar is itself (None, bool, int,
float, str) and everything else is a tagged array:

    ["list", [v...]]  ["tuple", [v...]]  ["set", [v...]]  ["frozenset", [v...]]  ["dict", [[k, v]...]]
    ["bytes", hex]  ["bytearray", hex]  ["complex", re, im]  ["range", start, stop, step]
    ["fraction", numerator, denominator]  ["decimal", text]  ["iter", [v...]]  ["handle", id, type name]
    ["ref", id]  ["global", name]

`encode(value, handle)` calls `handle(obj)` for a non-plain object (the candidate's side keeps the object and
answers ["handle", id, type name]; the tests' side refuses it). `decode(wire, resolve)` rebuilds fresh built-in
objects and calls `resolve(tag, fields)` for "handle", "ref" and "global". Nothing is evaluated: decoding builds
only the types above, so a decoded value has no method a candidate wrote. Depth is limited to MAX_DEPTH; a deeper
value, a malformed array, an unhashable key or member raises ValueError.
"""


MAX_DEPTH = 100
_ITERATORS = frozenset(type(x) for x in (
    (i for i in ()), map(int, ()), filter(None, ()), zip(), enumerate(()), reversed(()), iter([]), iter(()),
    iter(""), iter(range(0)), iter(set()), iter({}), iter({}.values()), iter({}.items()), reversed([]),
))


def _exact(value, module, name):
    mod = __import__("sys").modules.get(module)
    return mod is not None and type(value) is getattr(mod, name, None)


def encode(value, handle, depth=0):
    """The wire form of `value`; non-plain objects go through `handle`. Generators and the built-in iterators are
    drained into ["iter", ...]. Raises ValueError past MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested deeper than %d" % MAX_DEPTH)
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is str:
        return value
    down = depth + 1
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        return [kind.__name__, [encode(v, handle, down) for v in value]]
    if kind is dict:
        return ["dict", [[encode(k, handle, down), encode(v, handle, down)] for k, v in value.items()]]
    if kind is bytes or kind is bytearray:
        return [kind.__name__, value.hex()]
    if kind is complex:
        return ["complex", value.real, value.imag]
    if kind is range:
        return ["range", value.start, value.stop, value.step]
    if _exact(value, "fractions", "Fraction"):
        return ["fraction", value.numerator, value.denominator]
    if _exact(value, "decimal", "Decimal"):
        return ["decimal", str(value)]
    if kind in _ITERATORS:
        return ["iter", [encode(v, handle, down) for v in value]]
    if _numpy_scalar(value):
        return encode(value.item(), handle, down)
    return handle(value)


def _numpy_scalar(value):
    """A numpy bool, integer or floating scalar of numpy's own type (np.float64(0.5), np.int64(3), np.bool_(True)):
    sent as the Python value `.item()` gives, so a program that computes with numpy returns what it would print.
    Arrays are not plain (their == is elementwise)."""
    np = __import__("sys").modules.get("numpy")
    return np is not None and type(value) in (np.bool_, np.float16, np.float32, np.float64, np.int8, np.int16,
                                              np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)


def _items(fields, n):
    if len(fields) != n:
        raise ValueError("malformed value")
    return fields


def decode(wire, resolve, depth=0):
    """The value `wire` stands for (see the module docstring). Raises ValueError on anything malformed."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested deeper than %d" % MAX_DEPTH)
    kind = type(wire)
    if wire is None or kind is bool or kind is int or kind is float or kind is str:
        return wire
    if kind is not list or not wire or type(wire[0]) is not str:
        raise ValueError("malformed value")
    tag, fields, down = wire[0], wire[1:], depth + 1
    try:
        if tag in ("list", "tuple", "set", "frozenset", "iter"):
            (members,) = _items(fields, 1)
            if type(members) is not list:
                raise ValueError("malformed value")
            out = [decode(v, resolve, down) for v in members]
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset, "iter": iter}[tag](out)
        if tag == "dict":
            (pairs,) = _items(fields, 1)
            out = {}
            for pair in pairs:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("malformed value")
                out[decode(pair[0], resolve, down)] = decode(pair[1], resolve, down)
            return out
        if tag in ("bytes", "bytearray"):
            (text,) = _items(fields, 1)
            return (bytes if tag == "bytes" else bytearray).fromhex(text)
        if tag == "complex":
            re, im = _items(fields, 2)
            if type(re) is not float or type(im) is not float:
                raise ValueError("malformed value")
            return complex(re, im)
        if tag == "range":
            start, stop, step = _items(fields, 3)
            if not all(type(v) is int for v in (start, stop, step)):
                raise ValueError("malformed value")
            return range(start, stop, step)
        if tag == "fraction":
            num, den = _items(fields, 2)
            if type(num) is not int or type(den) is not int:
                raise ValueError("malformed value")
            return __import__("fractions").Fraction(num, den)
        if tag == "decimal":
            (text,) = _items(fields, 1)
            if type(text) is not str:
                raise ValueError("malformed value")
            return __import__("decimal").Decimal(text)
        if tag in ("handle", "ref", "global"):
            return resolve(tag, fields)
    except ValueError:
        raise
    except Exception as exc:  # unhashable key or member, bad hex, a huge int, ...
        raise ValueError("malformed value (%s)" % type(exc).__name__) from None
    raise ValueError("malformed value")


def dumps(obj):
    """JSON bytes of an already-encoded message (the candidate's replies). Written here rather than with the json
    package, whose import would cost the candidate's fresh interpreter more than the rest of its start; strings are
    escaped by json's own C function. Raises ValueError for an int too long to print (sys.int_info's limit)."""
    from _json import encode_basestring_ascii

    parts = []

    def write(value, depth):
        if depth > MAX_DEPTH + 3:
            raise ValueError("message nested too deep")
        kind = type(value)
        if value is None:
            parts.append("null")
        elif kind is bool:
            parts.append("true" if value else "false")
        elif kind is int:
            parts.append(int.__repr__(value))
        elif kind is float:
            parts.append(float.__repr__(value) if value == value and value not in (_INF, -_INF)
                         else "NaN" if value != value else "Infinity" if value > 0 else "-Infinity")
        elif kind is str:
            parts.append(encode_basestring_ascii(value))
        elif kind is list:
            parts.append("[")
            for i, item in enumerate(value):
                if i:
                    parts.append(",")
                write(item, depth + 1)
            parts.append("]")
        else:
            raise ValueError("cannot write a %s" % kind.__name__)

    write(obj, 0)
    return "".join(parts).encode("ascii")


_INF = float("inf")


def loads(data):
    """The message in wire bytes. Raises ValueError on anything that is not JSON (too deep included)."""
    import json

    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise ValueError("malformed message (%s)" % type(exc).__name__) from None


MAX_MESSAGE = 16 << 20  # bytes of one message: a reply past it fails the call


def send(fd, data):
    """Write one message's bytes to `fd`, after their length (4 bytes, big-endian)."""
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[__import__("os").write(fd, data):]


def recv(fd):
    """Read one message's bytes from `fd`. Raises EOFError when the other side is gone, ValueError when the message
    is longer than MAX_MESSAGE."""
    size = int.from_bytes(_read(fd, 4), "big")
    if size > MAX_MESSAGE:
        raise ValueError("message of %d bytes is over the %d-byte limit" % (size, MAX_MESSAGE))
    return _read(fd, size)


def _read(fd, n):
    chunks, left = [], n
    while left:
        chunk = __import__("os").read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other process closed its end")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)

"""JSON round-trip and validation for the contract dataclasses.

Every contract is a `kw_only` dataclass. `from_dict` checks the input against the type hints
(unknown fields, missing fields, wrong types) and then calls the class's `validate()`, so that
a malformed file fails with one line naming the field path, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import json
import os
import stat
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from meshplan.errors import MeshplanError, disk_full, os_error_text

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _fail(path: str, value: Any, expected: str) -> MeshplanError:
    shown = json.dumps(value)[:60] if not isinstance(value, str) else repr(value[:60])
    return MeshplanError(f"{path} = {shown}: expected {expected}")


def _convert(tp: Any, value: Any, path: str) -> Any:
    """Convert a JSON value to `tp`, raising MeshplanError with the field path on mismatch."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors: list[MeshplanError] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except MeshplanError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise _fail(path, value, " or ".join(_type_name(a) for a in args))
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise _fail(path, value, "one of " + ", ".join(map(repr, choices)))
        return value
    if origin is list:
        if not isinstance(value, list):
            raise _fail(path, value, "a list")
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _fail(path, value, "an object")
        key_tp, val_tp = typing.get_args(tp) or (str, Any)
        return {str(k): _convert(val_tp, v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(typing.cast(type, tp), value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise _fail(path, value, "true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(path, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(path, value, "a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _fail(path, value, "a string")
        return value
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # a bug in a contract, not user input


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass `cls` from parsed JSON, checking fields and types, then `validate()`."""
    where = path or cls.__name__
    if not isinstance(data, dict):
        raise _fail(where, data, f"an object ({cls.__name__})")
    precheck = getattr(cls, "precheck", None)
    if precheck is not None:  # e.g. Plan's schema_version, before an old file's fields are read
        precheck(data, path)
    hints = _hints(typing.cast(type, cls))
    fields = {f.name: f for f in dataclasses.fields(typing.cast(Any, cls)) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise MeshplanError(
            f"{where}.{unknown[0]}: unknown field for {cls.__name__}; known fields are {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, field in fields.items():
        sub = f"{path}.{name}" if path else name
        if name not in data:
            no_default = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
            if no_default:
                raise MeshplanError(f"{sub}: missing required field of {cls.__name__}")
            continue
        kwargs[name] = _convert(hints[name], data[name], sub)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(path)
    return obj


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's resolved field types, once per class (resolving compiles every string
    annotation: a cached 175B profile's load had paid that ~200 times)."""
    return typing.get_type_hints(cls)


def to_dict(obj: Any) -> Any:
    """Dataclass → plain JSON-able structure (dicts keep insertion order)."""
    if dataclasses.is_dataclass(obj):
        hints = _hints(typing.cast(type, type(obj)))
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("omit_empty") and not value:
                continue  # an optional record (Provenance.config) appears only when set
            # a float field given an int in Python serialises as a float, so load(save(x)) == x
            if hints[f.name] is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            out[f.name] = to_dict(value)
        return out
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """Deterministic JSON text (same object, same bytes)."""
    return json.dumps(to_dict(obj), indent=2, sort_keys=False, allow_nan=False) + "\n"


def content_hash(obj: Any) -> str:
    """sha256 of the canonical JSON of a contract; used for provenance in plans."""
    text = json.dumps(to_dict(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` so that a failure never leaves a half-written file, and never
    replace what the user did not name.

    A regular file (or a new one) is written via a temporary file and a rename; a symlink is
    written through (its target is replaced, the link stays); a character device (/dev/null,
    /dev/stdout on a terminal) or a FIFO with a reader is written in place, never renamed over;
    a FIFO without a reader, a socket or a block device is refused. A new file gets the mode a
    plain open() would (0666 less the umask), an existing one keeps its mode. A path that cannot
    be written (under a file, a directory, /proc, a full disk) is one MeshplanError line."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode  # follows a symlink to what it names
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise MeshplanError(f"cannot write {str(path)!r}: {os_error_text(exc)}") from None
    if mode is not None and not stat.S_ISREG(mode):
        _write_special(path, mode, text)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # a dangling or regular-file link: write its target
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise MeshplanError(
            f"cannot write {str(path)!r}: {str(blocker)!r} is a file, not a directory; give another path"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise MeshplanError(
            f"cannot write {str(path)!r}: {os_error_text(exc)}; give a path in a writable directory"
        ) from None
    try:
        os.fchmod(fd, stat.S_IMODE(mode) if mode is not None else 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            fix = "; free space or give a path on another disk" if disk_full(exc) else ""
            raise MeshplanError(f"cannot write {str(path)!r}: {os_error_text(exc)}{fix}") from None
        raise


def _write_special(path: Path, mode: int, text: str) -> None:
    """Write into an existing non-regular file in place (never renamed over), or refuse it."""
    if stat.S_ISDIR(mode):
        raise MeshplanError(f"cannot write {str(path)!r}: it is a directory; give a file path")
    if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        kind = "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file"
        raise MeshplanError(f"cannot write {str(path)!r}: it is {kind}; give a file path")
    try:  # O_NONBLOCK: a FIFO nobody reads is refused at once instead of blocking forever
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise MeshplanError(
                f"cannot write {str(path)!r}: it is a FIFO with no reader; start its reader first or give a file path"
            ) from None
        raise MeshplanError(f"cannot write {str(path)!r}: {os_error_text(exc)}") from None
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    except OSError as exc:
        fix = "; give a file path" if not disk_full(exc) else ""
        raise MeshplanError(f"cannot write {str(path)!r}: {os_error_text(exc)}{fix}") from None


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (/proc/self/status)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


MAX_INPUT_BYTES = 1 << 30
"""The largest input file read (a gpt3-175b profile is a few MiB): a bigger one is refused."""


def read_text_file(path: str | os.PathLike, what: str) -> str:
    """A user's text file as str; missing, unreadable, not a regular file (a FIFO would block, a
    device never ends), over MAX_INPUT_BYTES or non-UTF-8 is one MeshplanError line."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a file"
            )
            raise MeshplanError(
                f"{what} file {str(path)!r} is {kind}, not a regular file; give the file meshplan wrote"
            )
        with open(path, "rb") as fh:
            data = fh.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise MeshplanError(
                f"{what} file {str(path)!r} is over {MAX_INPUT_BYTES >> 20} MiB; give the file meshplan wrote"
            )
        return data.decode("utf-8")
    except FileNotFoundError:
        raise MeshplanError(f"{what} file {str(path)!r} does not exist; check the path") from None
    except IsADirectoryError:
        raise MeshplanError(f"{what} file {str(path)!r} is a directory; give a file") from None
    except OSError as exc:
        raise MeshplanError(f"{what} file {str(path)!r} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise MeshplanError(
            f"{what} file {str(path)!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
            f"offset {exc.start}); give the text file meshplan wrote"
        ) from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number meshplan accepts (every number must be finite)")


def save(obj: Any, path: str | os.PathLike) -> None:
    write_text_atomic(path, dumps(obj))


def load(cls: type[T], path: str | os.PathLike, what: str | None = None) -> T:
    """Read and validate a contract file; every failure is one MeshplanError line."""
    what = what or cls.__name__
    text = read_text_file(path, what)
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise MeshplanError(
            f"{what} file {str(path)!r} nests JSON too deeply for any meshplan file; give the file meshplan wrote"
        ) from None
    except json.JSONDecodeError as exc:
        raise MeshplanError(
            f"{what} file {str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg}); regenerate it with meshplan"
        ) from None
    except ValueError as exc:  # NaN, Infinity, -Infinity; an integer of more than 4300 digits
        reason = "it holds an integer too long to read" if "digits" in str(exc) else str(exc)
        raise MeshplanError(f"{what} file {str(path)!r}: {reason}; regenerate it with meshplan") from None
    try:
        return from_dict(cls, data)
    except MeshplanError as exc:
        other = _other_contract(cls, data)
        if other is not None:
            raise MeshplanError(
                f"{what} file {str(path)!r} is a {other[0]} ({other[1]}), not a {cls.__name__}; give the right file"
            ) from None
        raise MeshplanError(f"{path}: {exc}") from None
    except RecursionError:
        raise MeshplanError(f"{what} file {str(path)!r} nests too deeply; give the file meshplan wrote") from None


CONTRACTS: dict[type, str] = {}
"""Every contract type -> where its files come from, for _other_contract. The contracts import
this module, so it cannot import them: meshplan/__init__.py registers them (every import of a
meshplan module runs it first)."""


def _other_contract(cls: type, data: Any) -> tuple[str, str] | None:
    """(name, where it comes from) of the contract whose fields `data` has, if not `cls`'s: a
    profile passed as a plan is told so, not to re-plan."""
    if not isinstance(data, dict):
        return None
    for other, origin in CONTRACTS.items():
        fields = {f.name: f for f in dataclasses.fields(other) if f.init}
        required = {
            n
            for n, f in fields.items()
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        if other is not cls and set(data) <= set(fields) and required <= set(data):
            return other.__name__, origin
    return None


def check(cond: bool, path: str, value: Any, fix: str) -> None:
    """Validation helper for `validate()` methods: raise one line naming field, value and fix."""
    if not cond:
        raise MeshplanError(f"{path} = {json.dumps(value, default=str)[:80]}: {fix}")


def check_output(output: str | os.PathLike, *, folder: bool = False, inputs: dict[str, Any] | None = None) -> None:
    """Before any work: `output` (a file, or a folder with folder=True) is writable and is not
    one of the command's input files (`inputs`: flag -> path), so a long measurement never ends
    in an unwritable -o and -o never overwrites what the command reads. Creates nothing."""
    out = Path(output)
    for flag, given in (inputs or {}).items():
        if given and out.exists() and Path(given).exists() and os.path.samefile(given, out):
            raise MeshplanError(f"-o {str(output)!r} is the {flag} input; write to another path")
    kind = "folder" if folder else "file"
    if out.exists():
        if folder and not out.is_dir():
            raise MeshplanError(f"cannot write into {str(output)!r}: {str(output)!r} is a file, not a directory")
        if not folder and out.is_dir():
            raise MeshplanError(f"cannot write {str(output)!r}: it is a directory; give a file path")
        if not stat.S_ISREG(out.stat().st_mode) and not folder:
            return  # a device or FIFO: written in place (write_text_atomic says what it refuses)
        target = out if folder else out.resolve().parent
    else:
        target = next((p for p in out.parents if p.exists()), Path("."))
        if not target.is_dir():
            raise MeshplanError(
                f"cannot write {str(output)!r}: {str(target)!r} is a file, not a directory; give another path"
            )
    try:  # a probe, not os.access: root passes access() on /proc and on read-only mounts
        fd, probe = tempfile.mkstemp(dir=target, prefix=".meshplan-probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise MeshplanError(
            f"cannot write {str(output)!r}: {str(target)!r} is not writable ({_unwritable_why(target, exc)}); "
            f"give another {kind} path"
        ) from None


def _unwritable_why(folder: Path, exc: OSError) -> str:
    """Why a probe file could not be made in an existing folder: /proc answers 'No such file or
    directory' for a folder that is plainly there, which reads as nonsense."""
    if exc.errno == errno.ENOENT and folder.is_dir():
        return "it accepts no new files: a kernel filesystem such as /proc or /sys"
    return os_error_text(exc)

"""Artifacts: safetensors + JSON (never pickle), written atomically, reused only when they match.

Every artifact ``NAME.safetensors`` has a sidecar ``NAME.json`` holding its *key* (model id, task
fingerprint, the configs that determine it) and its provenance (seed, package versions, time).
:func:`load_if_valid` returns the cached tensors when the key matches, ``None`` when there is no
artifact or it is damaged (truncated, unreadable, half-written, or failing its content checks:
it is named in a warning and recomputed), and raises :class:`ArtifactMismatchError` when an
artifact made with another model or config is in the way, so nothing is ever silently reused
or overwritten. Every file is written atomically (:func:`write_atomic`).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import re
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from site_interp.errors import UserError

log = logging.getLogger(__name__)

_UMASK = os.umask(0)
os.umask(_UMASK)


def _process_space() -> str:
    """This host and its pid namespace (two containers may share a hostname, not their pids)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", platform.node()) or "host"
    try:
        return f"{host}-{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return host


# a temporary of write_atomic names its writer (".<name>.<pid>@<process space>~XXXX.tmp"), so
# that a run sweeping up after killed runs leaves alone the writes still going on in another process
_HOST = _process_space()
_WRITER = re.compile(r"\.(\d+)@([A-Za-z0-9.-]+)~[^/]*\.tmp$")
_FOREIGN_HOST_STALE_S = 24 * 3600.0

PACKAGES = ("site_interp", "torch", "transformers", "transformer-lens", "numpy")


class ArtifactMismatchError(UserError, RuntimeError):
    """An existing artifact was made with another model, task data or configuration."""


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def provenance(seed: int | None = None) -> dict[str, Any]:
    """Seed, package versions and creation time, stored next to every artifact."""
    return {"seed": seed, "versions": package_versions(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def slug(text: str) -> str:
    """A file-system-safe name (``google/gemma-3-270m`` -> ``google--gemma-3-270m``)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text.replace("/", "--")).strip("-")
    # never a hidden name or a path step ("..", "."): artifacts stay inside their parent directory
    name = re.sub(r"^\.+", lambda m: "_" * len(m.group()), name)
    return name or "x"


def write_atomic(path: str | Path, write: Callable[[str], Any]) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` fills a temporary file beside it, which then
    replaces ``path`` in one rename, so a reader (or a killed run) never sees a partial file.
    Every file this package writes goes through here."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}@{_HOST}~", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _writer_may_be_alive(tmp: Path) -> bool:
    """Whether the process that made temporary ``tmp`` may still be writing it: its pid (in the
    name) is alive in this process space (host and pid namespace), or it ran in another (whose
    processes this one cannot see) less than a day ago. Temporaries without a writer in the name count as stale."""
    found = _WRITER.search(tmp.name)
    if found is None:
        return False
    pid, host = int(found[1]), found[2]
    if host != _HOST:
        try:
            return time.time() - tmp.stat().st_mtime < _FOREIGN_HOST_STALE_S
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


@contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on the file ``path`` (created if missing) for the block: a
    second process entering it for the same path waits until the first has left, so a result that
    two runs may both need (e.g. the FV ranking of tasks two chunks share) is computed once, by
    whoever comes first, and read by the other (re-check the cache inside the block). Where the
    platform has no ``fcntl`` (Windows) the block runs unlocked."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover (not POSIX)
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_stale_temporaries(directory: str | Path) -> int:
    """Delete the temporary files of :func:`write_atomic` that a killed process left in
    ``directory`` (never a finished file, nor the temporary of a write still in progress in
    another process, such as a second run on other tasks in the same directory); returns how many."""
    directory = Path(directory)
    # ours end in .tmp and name their writer; safetensors' own writer leaves .tmpXXXXXX
    found = [*directory.glob(".*.tmp"), *directory.glob(".tmp?*")] if directory.is_dir() else []
    stale = [tmp for tmp in found if not _writer_may_be_alive(tmp)]
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return len(stale)


def write_json(path: str | Path, obj: Any) -> Path:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    text = json.dumps(obj, indent=2, sort_keys=False, default=_jsonable)
    write_atomic(path, lambda tmp: Path(tmp).write_text(text + "\n"))
    return path


def write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    write_atomic(path, lambda tmp: Path(tmp).write_text(text))
    return path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def read_json_object(path: str | Path, *, warn: bool = True) -> dict | None:
    """A JSON file's object; None when it is absent, or damaged (unreadable, not an object) --
    named in a warning, unless ``warn`` is False (a reader that only sums what it finds)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = read_json(path)
    except (OSError, ValueError) as err:
        reason = str(err)
    else:
        if isinstance(data, dict):
            return data
        reason = "not a JSON object"
    if warn:
        _damaged(path, reason)
    return None


def save_artifact(
    path: str | Path, tensors: Mapping[str, torch.Tensor], key: Mapping[str, Any], info: Mapping[str, Any] | None = None,
    *, seed: int | None = None,
) -> Path:
    """Save ``tensors`` to ``path`` (``.safetensors``) and key/provenance/info to its sidecar JSON.

    Both files carry the same random write id, so a reader can tell a pair written together
    from tensors of one write beside the sidecar of an earlier one (a kill between the two)."""
    path = Path(path)
    data = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    write = uuid.uuid4().hex
    metadata = {"key": json.dumps(key, sort_keys=True, default=_jsonable), "write": write}
    write_atomic(path, lambda tmp: save_file(data, tmp, metadata=metadata))
    write_json(path.with_suffix(".json"), {"key": dict(key), "write": write, "provenance": provenance(seed), **(info or {})})
    return path


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    old = json.loads(json.dumps(old, default=_jsonable))
    new = json.loads(json.dumps(new, default=_jsonable))
    parts = [
        f"{k}: stored {old.get(k)!r}, requested {new.get(k)!r}"
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
    ]
    return "; ".join(parts)


def _check_key(path: Path, stored: Mapping[str, Any], key: Mapping[str, Any]) -> None:
    wanted = json.loads(json.dumps(key, default=_jsonable))
    if stored != wanted:
        raise ArtifactMismatchError(
            f"{path} was made with a different model, task or configuration ({_diff(stored, wanted)}). "
            "It is not reused: choose another output directory (--out), or delete it to recompute."
        )


def save_json_artifact(path: str | Path, key: Mapping[str, Any], payload: Mapping[str, Any], *, seed: int | None = None) -> Path:
    """A JSON-only artifact (results, records): ``{"key", "provenance", **payload}``, written atomically."""
    return write_json(path, {"key": dict(key), "provenance": provenance(seed), **payload})


class DamagedArtifact(Exception):
    """An artifact that cannot be read or fails its checks (internal: it is recomputed)."""


def _damaged(path: Path, reason: str) -> None:
    log.warning("%s is damaged (%s): recomputing it", path, reason)


def _read_json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DamagedArtifact(f"unreadable JSON: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("key"), dict):
        raise DamagedArtifact("no 'key' object in the sidecar")
    return data


def load_json_if_valid(
    path: str | Path, key: Mapping[str, Any], check: Callable[[dict], None] | None = None,
    *, fields: Sequence[str] = (),
) -> dict | None:
    """A JSON artifact whose key equals ``key``; ``None`` if absent or damaged (logged, so it is
    recomputed); :class:`ArtifactMismatchError` when it was made with other settings.
    ``fields``: the payload every such artifact carries; a file without one is another kind of
    file at this path (an older version's) and counts as damaged, before its key is compared.
    ``check(data)`` may raise :class:`DamagedArtifact` for content that cannot be right."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = _read_json_object(path)
        missing = [f for f in fields if f not in data]
        if missing:
            raise DamagedArtifact(f"it lacks {', '.join(missing)}: not this artifact")
        _check_key(path, data["key"], key)
        if check is not None:
            check(data)
    except DamagedArtifact as err:
        _damaged(path, str(err))
        return None
    return data


def load_if_valid(
    path: str | Path, key: Mapping[str, Any],
    check: Callable[[dict[str, torch.Tensor], dict], None] | None = None,
) -> tuple[dict[str, torch.Tensor], dict] | None:
    """The tensors and sidecar of a cached artifact whose key equals ``key``.

    ``None`` when there is none (a sidecar alone counts as none: its tensors were set aside), or
    when it is damaged: a truncated or unreadable file, a sidecar
    that is not JSON or lacks its key, tensors and sidecar from two different writes, or content
    that ``check(tensors, meta)`` rejects (raising :class:`DamagedArtifact`). A damaged artifact
    is named in a warning and recomputed by the caller, never a dead end. Raises
    :class:`ArtifactMismatchError` naming the differences when it was made with other settings.
    """
    path = Path(path)
    sidecar = path.with_suffix(".json")
    if not path.exists():
        # No tensors: never computed, or set aside on purpose (a results store keeps the sidecar's
        # record and drops bulky tensors, see docs/results.md). Writes put the tensors first, so
        # no interrupted write leaves a sidecar alone.
        return None
    try:
        if not sidecar.exists():
            raise DamagedArtifact(f"{sidecar.name} is missing")
        meta = _read_json_object(sidecar)
        try:
            with safe_open(str(path), framework="pt") as f:
                stored = (f.metadata() or {}).get("key")
                write = (f.metadata() or {}).get("write")
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except Exception as err:  # safetensors raises its own error types for truncated or foreign files
            raise DamagedArtifact(f"unreadable tensors: {err}") from err
        if (stored is None or json.loads(stored) != json.loads(json.dumps(meta["key"], default=_jsonable))
                or write != meta.get("write")):  # artifacts from before write ids have neither
            raise DamagedArtifact("tensors and sidecar come from different writes")
        _check_key(path, meta["key"], key)
        if check is not None:
            check(tensors, meta)
    except DamagedArtifact as err:
        _damaged(path, str(err))
        return None
    return tensors, meta


def check_tensor(tensors: Mapping[str, torch.Tensor], name: str, shape: tuple[int | None, ...],
                 low: float | None = None, high: float | None = None) -> None:
    """Raise :class:`DamagedArtifact` unless ``tensors[name]`` exists, has ``shape`` (None: any
    size on that axis), is finite and lies in ``[low, high]``."""
    t = tensors.get(name)
    if t is None:
        raise DamagedArtifact(f"no tensor {name!r}")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        raise DamagedArtifact(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if not torch.isfinite(t).all():
        raise DamagedArtifact(f"{name} holds NaN or infinite values")
    if (low is not None and t.min() < low) or (high is not None and t.max() > high):
        raise DamagedArtifact(f"{name} lies outside [{low}, {high}]")

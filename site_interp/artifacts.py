"""Artifacts: safetensors + JSON (never pickle), written atomically, reused only when they match.

Every artifact ``NAME.safetensors`` has a sidecar ``NAME.json`` holding its *key* (model id, task
fingerprint, the configs that determine it) and its provenance (seed, package versions, time).
:func:`load_if_valid` returns the cached tensors when the key matches, ``None`` when there is no
artifact, and raises :class:`ArtifactMismatchError` when an artifact made with another model or
config is in the way, so nothing is ever silently reused or overwritten.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from safetensors.torch import load_file, save_file

from site_interp.errors import UserError

_UMASK = os.umask(0)
os.umask(_UMASK)

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
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text.replace("/", "--")).strip("-") or "x"


def write_atomic(path: str | Path, write: Callable[[str], Any]) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` fills a temporary file beside it, which then
    replaces ``path`` in one rename, so a reader (or a killed run) never sees a partial file.
    Every file this package writes goes through here."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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


def save_artifact(
    path: str | Path, tensors: Mapping[str, torch.Tensor], key: Mapping[str, Any], info: Mapping[str, Any] | None = None,
    *, seed: int | None = None,
) -> Path:
    """Save ``tensors`` to ``path`` (``.safetensors``) and key/provenance/info to its sidecar JSON."""
    path = Path(path)
    data = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    write_atomic(path, lambda tmp: save_file(data, tmp, metadata={"key": json.dumps(key, sort_keys=True, default=_jsonable)}))
    write_json(path.with_suffix(".json"), {"key": dict(key), "provenance": provenance(seed), **(info or {})})
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


def load_json_if_valid(path: str | Path, key: Mapping[str, Any]) -> dict | None:
    """A JSON artifact whose key equals ``key``; ``None`` if absent; :class:`ArtifactMismatchError` otherwise."""
    path = Path(path)
    if not path.exists():
        return None
    data = read_json(path)
    _check_key(path, data.get("key", {}), key)
    return data


def load_if_valid(path: str | Path, key: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict] | None:
    """The tensors and sidecar of a cached artifact whose key equals ``key``; ``None`` if absent.

    Raises :class:`ArtifactMismatchError` naming the differences when the key differs.
    """
    path = Path(path)
    sidecar = path.with_suffix(".json")
    if not path.exists() or not sidecar.exists():
        return None
    meta = read_json(sidecar)
    _check_key(path, meta.get("key", {}), key)
    return load_file(str(path)), meta

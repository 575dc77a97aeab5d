"""Where each model of a sweep runs: devices locally, CPU and GPU shares on Ray.

:func:`plan_placement` is a pure function of the options and the number of GPUs there are, so it
is tested on a machine without any. The rules:

* no ``--device``: CUDA when there is a GPU, else CPU (as :func:`site_interp.loading.load_model`);
* ``--executor local``: the models run one after the other in this process; with ``--device cuda``
  and several GPUs they take turns over them (model *i* on ``cuda:i mod n``), unless
  ``--device-map`` shards each model over all of them; ``--device cuda:k`` pins every model;
* ``--executor ray``: each model gets an actor with ``num_gpus`` (``--gpus-per-model``, default 1
  on CUDA, 0 on CPU; fractions such as 0.25 pack small models onto one GPU; above 1 a whole
  number, the model then sharded with ``--device-map auto``) and ``num_cpus``
  (``--cpus-per-model``); Ray picks the GPUs and the actor sees them as ``cuda``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, Mapping, Sequence

from site_interp.errors import ConfigError

Executor = Literal["local", "ray"]


@dataclass(frozen=True)
class Placement:
    """The resources and load options of one model."""

    model: str
    """The model, as named on the command line."""
    device: str
    """``cpu``, ``cuda`` or ``cuda:k``: what :func:`~site_interp.loading.load_model` gets."""
    device_map: str | None = None
    """``auto`` (or None): shard the model over the GPUs it can see."""
    num_gpus: float = 0.0
    """GPUs reserved for the model's Ray actor (fractions allowed below 1); locally, the GPUs it uses."""
    num_cpus: float = 1.0
    """CPUs reserved for the model's Ray actor; also its torch threads (at least 1)."""
    dtype: str | None = None
    """``float32``, ``bfloat16`` or ``float16``; None: float32 on CPU, bfloat16 on CUDA."""
    load_in_4bit: bool = False
    """4-bit weights through bitsandbytes (CUDA only)."""

    def __post_init__(self) -> None:
        if self.num_gpus < 0 or not math.isfinite(self.num_gpus):
            raise ConfigError(f"--gpus-per-model for {self.model} must be >= 0, got {self.num_gpus}")
        if self.num_gpus > 1 and not float(self.num_gpus).is_integer():
            raise ConfigError(f"--gpus-per-model for {self.model} must be a fraction below 1 or a whole number, "
                              f"got {self.num_gpus}")
        if not self.num_cpus > 0:
            raise ConfigError(f"--cpus-per-model for {self.model} must be > 0, got {self.num_cpus}")

    @property
    def threads(self) -> int:
        """torch threads of a worker with this placement."""
        return max(1, int(self.num_cpus))

    def load_kwargs(self) -> dict:
        """Keyword arguments of :func:`~site_interp.loading.load_model` (dtype as a name)."""
        return {"device": self.device, "device_map": self.device_map, "dtype": self.dtype,
                "load_in_4bit": self.load_in_4bit}

    def to_dict(self) -> dict:
        return asdict(self)


def parse_per_model(values: Sequence[str] | None, option: str, models: Sequence[str]) -> tuple[float | None, dict[str, float]]:
    """``["0.5", "big-model=2"]`` -> (0.5, {"big-model": 2.0}): a default and per-model values."""
    default: float | None = None
    per: dict[str, float] = {}
    for item in values or ():
        name, _, number = item.rpartition("=") if "=" in item else ("", "", item)
        try:
            value = float(number)
        except ValueError:
            raise ConfigError(f"{option} takes numbers or MODEL=NUMBER, got {item!r}") from None
        if name and name not in models:
            raise ConfigError(f"{option} names {name!r}, which is not in --models ({', '.join(models)})")
        if name:
            per[name] = value
        else:
            default = value
    return default, per


def plan_placement(
    models: Sequence[str], *, executor: Executor = "local", device: str | None = None, device_map: str | None = None,
    dtype: str | None = None, load_in_4bit: bool = False, gpus_per_model: float | Mapping[str, float] | None = None,
    cpus_per_model: float | Mapping[str, float] = 1.0, available_gpus: int = 0,
) -> dict[str, Placement]:
    """Each model's :class:`Placement`, from the options and the GPUs there are (locally, or
    in the Ray cluster). Raises :class:`~site_interp.errors.ConfigError` naming the option when
    the options cannot be met (a GPU option without GPUs, a model asking for more GPUs than the
    cluster has, a fixed ``cuda:k`` under Ray)."""
    if executor not in ("local", "ray"):
        raise ConfigError(f"--executor must be local or ray, got {executor!r}")
    device = device or ("cuda" if available_gpus > 0 else "cpu")
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu, cuda or cuda:K for a sweep, got {device!r}")
    on_gpu = kind == "cuda"
    if on_gpu and available_gpus < 1:
        raise ConfigError(f"--device {device} but no GPU is visible" +
                          (" in the Ray cluster" if executor == "ray" else "") + ": use --device cpu")
    if not on_gpu and (device_map or load_in_4bit):
        raise ConfigError(f"--{'device-map' if device_map else 'load-in-4bit'} needs GPUs: use --device cuda")
    if index and (not index.isdigit() or int(index) >= available_gpus):
        raise ConfigError(f"--device {device}: there are {available_gpus} GPUs (cuda:0 to cuda:{available_gpus - 1})")
    if index and executor == "ray":
        raise ConfigError(f"--device {device} with --executor ray: Ray assigns the GPUs; use --device cuda "
                          "and --gpus-per-model")
    gpus = gpus_per_model if isinstance(gpus_per_model, Mapping) else {m: gpus_per_model for m in models}
    cpus = cpus_per_model if isinstance(cpus_per_model, Mapping) else {m: cpus_per_model for m in models}
    out: dict[str, Placement] = {}
    for i, model in enumerate(models):
        n_cpus = float(cpus.get(model) or 1.0)
        asked = gpus.get(model)
        if not on_gpu:
            if asked:
                raise ConfigError(f"--gpus-per-model gives {model} {asked} GPUs but the sweep runs on CPU: "
                                  "add --device cuda")
            out[model] = Placement(model, "cpu", None, 0.0, n_cpus, dtype, False)
            continue
        if executor == "ray":
            n_gpus = float(asked if asked is not None else 1.0)
            if n_gpus <= 0:
                raise ConfigError(f"--gpus-per-model gives {model} no GPU but --device is {device}")
            if n_gpus > available_gpus:
                raise ConfigError(f"--gpus-per-model gives {model} {n_gpus:g} GPUs but the Ray cluster has "
                                  f"{available_gpus}: ask for at most {available_gpus}")
            shard = device_map or ("auto" if n_gpus > 1 else None)
            out[model] = Placement(model, "cuda", shard, n_gpus, n_cpus, dtype, load_in_4bit)
            continue
        # local: one model at a time in this process
        if asked is not None:
            raise ConfigError("--gpus-per-model is for --executor ray; locally use --device cuda:K or --device-map auto")
        if device_map:
            out[model] = Placement(model, "cuda", device_map, float(available_gpus), n_cpus, dtype, load_in_4bit)
        elif index:
            out[model] = Placement(model, device, None, 1.0, n_cpus, dtype, load_in_4bit)
        else:
            out[model] = Placement(model, f"cuda:{i % available_gpus}", None, 1.0, n_cpus, dtype, load_in_4bit)
    return out


__all__ = ["Executor", "Placement", "parse_per_model", "plan_placement"]

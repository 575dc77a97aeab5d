"""Portable SITE results: one small folder per trained task, loadable onto any bridge of its model.

A SITE folder holds

* ``alphas.safetensors`` (``alpha[layer, head]``) and ``embedding.safetensors`` (``t[layer,
  head, d_head]``, and ``resid`` when known), each with the model id in its metadata;
* ``config.json``: format, model id, task (name, source, fingerprint), the prompt template, the
  embedding and training settings, accuracy, the kept step, and provenance (package versions);
* ``README.md``: a model card (task, model, accuracy, a markdown head map, how to load it), with
  an optional picture of the head map made elsewhere (this module draws nothing).

:func:`save_site` writes one from a :class:`~site_interp.pipeline.TaskRun` or a run's task
directory; :func:`load_site` reads it back and, given a bridge, refuses another model with a
:class:`SiteModelMismatchError` naming both. :func:`push_site` / :func:`pull_site` move a folder to
and from the Hugging Face Hub (``huggingface_hub``'s ``upload_folder`` and ``snapshot_download``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxtyping import Float
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from site_interp.artifacts import provenance, read_json, write_atomic, write_json, write_text
from site_interp.errors import ConfigError, UserError
from site_interp.evaluation import Method, standard_methods
from site_interp.hooks import Hooks, injection_hooks
from site_interp.pipeline import TaskRun, model_id
from site_interp.prompts import DEFAULT_TEMPLATE, PromptTemplate

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

FORMAT = "site_interp/site-folder/1"
"""``config.json``'s ``format``: what :func:`load_site` accepts."""
FILES = ("alphas.safetensors", "embedding.safetensors", "config.json", "README.md")
"""What every SITE folder holds (plus ``head_map.png`` when a picture was given)."""
IMAGE = "head_map.png"


class SiteFolderError(UserError):
    """A folder is not a readable SITE folder; the message says which file is wrong."""


class SiteModelMismatchError(UserError):
    """A SITE folder was trained on another model than the bridge it is loaded onto."""


class HubError(UserError):
    """The Hugging Face Hub could not be reached or refused the request."""


@dataclass
class SiteArtifact:
    """A trained SITE result as it travels: alphas, task embedding and how they were made."""

    model_id: str
    """The model the alphas were trained on (hub id or directory, as in run artifacts)."""
    task: str
    """Task name."""
    alpha: Float[Tensor, "layer head"]
    """Trained alphas."""
    t: Float[Tensor, "layer head d_head"]
    """The task embedding injected with them."""
    resid: Float[Tensor, "layer d_model"] | None = None
    """Mean residual stream of the embedding's prompts (task vectors), when known."""
    template: PromptTemplate = DEFAULT_TEMPLATE
    """The prompt template SITE was trained with (its 0-shot prompts use it)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Embedding and training settings (``embedding``, ``site``)."""
    task_source: str = ""
    """Where the task data came from."""
    task_fingerprint: str | None = None
    """Hash of the task data the alphas were trained on."""
    accuracy: list[dict] = field(default_factory=list)
    """Accuracy per method (rows of the run's summary), when the run was evaluated."""
    best_step: int | None = None
    """Training step whose alphas were kept."""
    path: Path | None = None
    """The folder it was read from."""

    def __post_init__(self) -> None:
        if self.alpha.dim() != 2:
            raise ConfigError(f"{self.task}: alpha must be [layer, head], got shape {tuple(self.alpha.shape)}")
        if self.t.dim() != 3 or tuple(self.t.shape[:2]) != tuple(self.alpha.shape):
            raise ConfigError(f"{self.task}: t must be [layer, head, d_head] matching alpha {tuple(self.alpha.shape)}, "
                              f"got {tuple(self.t.shape)}")

    def hooks(self) -> Hooks:
        """SITE's injection (``run_with_hooks(fwd_hooks=...)``, at the last token)."""
        return injection_hooks(self.alpha, self.t)

    def methods(self, n_shots: int = 10) -> list[Method]:
        """0-shot, N-shot ICL and SITE, for :func:`~site_interp.evaluation.evaluate`."""
        return standard_methods(self.t, self.alpha, n_shots)

    def check_bridge(self, bridge: TransformerBridge) -> None:
        """Raise :class:`SiteModelMismatchError` unless ``bridge`` is this artifact's model."""
        got = model_id(bridge)
        where = f"{self.path}" if self.path else f"the SITE result of {self.task}"
        if got != self.model_id:
            raise SiteModelMismatchError(
                f"{where} was trained on {self.model_id}, but the bridge is {got}: alphas and task embeddings "
                f"only mean something on their own model; load {self.model_id} to use it"
            )
        shape = (bridge.cfg.n_layers, bridge.cfg.n_heads, bridge.cfg.d_head)
        if tuple(self.t.shape) != shape:
            raise SiteModelMismatchError(f"{where} has t of shape {tuple(self.t.shape)}, but {got} has {shape}")


def _run_model_id(run: TaskRun) -> str | None:
    sidecar = Path(run.directory) / "alphas.json" if run.directory else None
    if sidecar is not None and sidecar.exists():
        return read_json(sidecar).get("key", {}).get("model_id")
    return None


def artifact_from_run(run: TaskRun, model: TransformerBridge | str | None = None,
                      template: PromptTemplate = DEFAULT_TEMPLATE) -> SiteArtifact:
    """The artifact of a pipeline :class:`~site_interp.pipeline.TaskRun`; ``model`` (a bridge or
    a model id) is needed when the run has no directory to read its model id from."""
    mid = model_id(model) if model is not None else _run_model_id(run)
    if mid is None:
        raise ConfigError(f"{run.task.name}: pass model= (the bridge or its model id): the run has no saved artifacts to read it from")
    summary = run.summary().to_dict(orient="records") if run.evaluation.records else []
    return SiteArtifact(
        model_id=mid, task=run.task.name, alpha=run.site.alpha.float(), t=run.embedding.t.float(), resid=run.embedding.resid,
        template=template, settings={"embedding": run.embedding.config.to_dict(), "site": run.site.config.to_dict()},
        task_source=run.task.source, task_fingerprint=run.task.fingerprint(), accuracy=summary, best_step=run.site.best_step,
    )


def artifact_from_dir(directory: str | Path) -> SiteArtifact:
    """The artifact of a run's task directory (``<out>/<model>/<task>/``)."""
    d = Path(directory)
    for name in ("alphas.safetensors", "alphas.json", "embedding.safetensors"):
        if not (d / name).exists():
            raise SiteFolderError(f"{d / name} is missing: is {d} a task directory of a finished run?")
    meta = read_json(d / "alphas.json")
    key = meta.get("key", {})
    emb = load_file(str(d / "embedding.safetensors"))
    config = read_json(d / "config.json") if (d / "config.json").exists() else {}
    summary = []
    if (d / "results.json").exists():
        summary = read_json(d / "results.json").get("summary", [])
    return SiteArtifact(
        model_id=key.get("model_id", ""), task=key.get("task", d.name), alpha=load_file(str(d / "alphas.safetensors"))["alpha"],
        t=emb["t"], resid=emb.get("resid"), settings={"embedding": key.get("embedding", {}), "site": key.get("site", {})},
        task_source=config.get("task_source", ""), task_fingerprint=key.get("task_fingerprint"), accuracy=summary,
        best_step=meta.get("best_step"),
    )


def head_map_markdown(alpha: Float[Tensor, "layer head"], threshold: float = 0.5) -> str:
    """A markdown table of alphas (layers as rows, heads as columns); values above ``threshold`` in bold."""
    n_heads = alpha.shape[1]
    lines = ["| layer | " + " | ".join(f"h{h}" for h in range(n_heads)) + " |", "|---" * (n_heads + 1) + "|"]
    for layer, row in enumerate(alpha.tolist()):
        cells = [f"**{v:.2f}**" if v > threshold else f"{v:.2f}" for v in row]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def model_card(art: SiteArtifact, *, image: bool = False) -> str:
    """The README.md of a SITE folder."""
    n_sel = int((art.alpha > 0.5).sum())
    front = ["---", "library_name: site_interp", "tags:", "- site", "- task-embedding", "- interpretability"]
    if "/" in art.model_id and not art.model_id.startswith("/"):
        front.append(f"base_model: {art.model_id}")
    front.append("---")
    acc = ""
    if art.accuracy:
        rows = ["| method | n | first token (%) | exact match (%) |", "|---|---|---|---|"]
        for r in art.accuracy:
            em = r.get("exact_match")
            rows.append(f"| {r.get('method')} | {r.get('n')} | {r.get('first_token', float('nan')):.1f} | "
                        f"{'' if em is None else f'{em:.1f}'} |")
        acc = "## Accuracy (held-out test queries)\n\n" + "\n".join(rows) + "\n\n"
    pic = f"![head map]({IMAGE})\n\n" if image else ""
    steps = art.settings.get("site", {}).get("steps")
    return "\n".join(front) + f"""

# SITE: {art.task} on {art.model_id}

Soft head selection for an ICL-derived task embedding (SITE): one weight `alpha` per attention head
of `{art.model_id}`, learned with the model frozen, so that at the last token of a 0-shot prompt
`z[l, h] <- (1 - alpha) z[l, h] + alpha t[l, h]` answers the task `{art.task}` without examples.
{n_sel} of {art.alpha.numel()} heads have alpha > 0.5 (kept step {art.best_step} of {steps}).

{acc}## Head map (alpha per layer and head; bold: > 0.5)

{pic}{head_map_markdown(art.alpha)}

## Use

```python
from site_interp import load_model
from site_interp.share import load_site

site = load_site("path/to/this/folder", bridge := load_model(...))   # refuses any other model
logits = bridge.run_with_hooks(tokens, fwd_hooks=site.hooks())        # 0-shot prompt, SITE injected
```

Prompt template: `{json.dumps(asdict(art.template))}`. Settings and versions: `config.json`.
Task data: {art.task_source or 'not recorded'} (fingerprint `{art.task_fingerprint}`).
"""


def _meta(art: SiteArtifact) -> dict[str, str]:
    return {"format": FORMAT, "model_id": art.model_id, "task": art.task}


def save_site(
    path: str | Path,
    run_or_parts: TaskRun | SiteArtifact | str | Path,
    *,
    model: TransformerBridge | str | None = None,
    template: PromptTemplate | None = None,
    image: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a SITE folder at ``path`` from a :class:`~site_interp.pipeline.TaskRun`, a
    :class:`SiteArtifact`, or a run's task directory; returns the folder.

    ``model`` (bridge or model id) names the model of a run without saved artifacts; ``template``
    the prompt template used (default: the package's); ``image`` an optional PNG of the head map
    (copied in and shown in the README). An existing SITE folder is replaced only with
    ``overwrite``; any other non-empty folder is refused.
    """
    if isinstance(run_or_parts, TaskRun):
        art = artifact_from_run(run_or_parts, model, template or DEFAULT_TEMPLATE)
    elif isinstance(run_or_parts, SiteArtifact):
        art = run_or_parts
    else:
        art = artifact_from_dir(run_or_parts)
    if template is not None:
        art.template = template
    if not art.model_id:
        raise ConfigError(f"{art.task}: the model id is unknown; pass model= (the bridge or its id)")
    out = Path(path)
    if out.exists() and any(out.iterdir()):
        is_site = (out / "config.json").exists() and read_json(out / "config.json").get("format") == FORMAT
        if not (is_site and overwrite):
            raise SiteFolderError(f"{out} is not empty; choose a new folder" + (" or pass overwrite=True" if is_site else ""))
    if image is not None and not Path(image).is_file():
        raise SiteFolderError(f"{image}: no such image file")
    meta = _meta(art)
    alpha = {"alpha": art.alpha.detach().float().cpu().contiguous()}
    emb = {"t": art.t.detach().float().cpu().contiguous()}
    if art.resid is not None:
        emb["resid"] = art.resid.detach().float().cpu().contiguous()
    write_atomic(out / "alphas.safetensors", lambda tmp: save_file(alpha, tmp, metadata=meta))
    write_atomic(out / "embedding.safetensors", lambda tmp: save_file(emb, tmp, metadata=meta))
    if image is not None:
        write_atomic(out / IMAGE, lambda tmp: shutil.copyfile(image, tmp))
    write_json(out / "config.json", {
        "format": FORMAT, "model_id": art.model_id, "task": art.task, "task_source": art.task_source,
        "task_fingerprint": art.task_fingerprint, "template": asdict(art.template), "settings": art.settings,
        "shape": list(art.t.shape), "accuracy": art.accuracy, "best_step": art.best_step,
        "n_selected_heads": int((art.alpha > 0.5).sum()), "provenance": provenance(art.settings.get("site", {}).get("seed")),
    })
    write_text(out / "README.md", model_card(art, image=image is not None))
    return out


def load_site(path: str | Path, bridge: TransformerBridge | None = None) -> SiteArtifact:
    """Read a SITE folder; with ``bridge``, check that it is the folder's model (else
    :class:`SiteModelMismatchError`, naming both) and move nothing else."""
    d = Path(path)
    if not (d / "config.json").exists():
        raise SiteFolderError(f"{d / 'config.json'} is missing: {d} is not a SITE folder (save one with save_site)")
    config = read_json(d / "config.json")
    if config.get("format") != FORMAT:
        raise SiteFolderError(f"{d / 'config.json'} has format {config.get('format')!r}; this version reads {FORMAT!r}")
    tensors: dict[str, Tensor] = {}
    for name in ("alphas.safetensors", "embedding.safetensors"):
        f = d / name
        if not f.exists():
            raise SiteFolderError(f"{f} is missing: the SITE folder is incomplete")
        with safe_open(str(f), framework="pt") as handle:
            stored = (handle.metadata() or {}).get("model_id")
        if stored is not None and stored != config.get("model_id"):
            raise SiteFolderError(f"{f} belongs to {stored}, config.json to {config.get('model_id')}: mixed folders")
        tensors.update(load_file(str(f)))
    art = SiteArtifact(
        model_id=config["model_id"], task=config["task"], alpha=tensors["alpha"], t=tensors["t"], resid=tensors.get("resid"),
        template=PromptTemplate(**config.get("template", {})), settings=config.get("settings", {}),
        task_source=config.get("task_source", ""), task_fingerprint=config.get("task_fingerprint"),
        accuracy=config.get("accuracy", []), best_step=config.get("best_step"), path=d,
    )
    if bridge is not None:
        art.check_bridge(bridge)
    return art


def push_site(path: str | Path, repo_id: str, *, token: str | None = None, private: bool = False,
              commit_message: str | None = None, create: bool = True) -> str:
    """Upload a SITE folder to the Hugging Face Hub model repository ``repo_id`` (created when
    missing, with ``create``); returns the commit URL. Needs a network and a write token."""
    art = load_site(path)  # never push a folder that does not load
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        if create:
            api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(path), repo_id=repo_id, repo_type="model",
                                 commit_message=commit_message or f"SITE: {art.task} on {art.model_id}",
                                 allow_patterns=list(FILES) + [IMAGE])
    except (OSError, ValueError) as err:  # requests / hub errors derive from these
        raise HubError(f"pushing {path} to {repo_id} failed ({type(err).__name__}: {err}); "
                       "check the network and your token (huggingface-cli login)") from err
    return str(getattr(info, "commit_url", info))


def pull_site(repo_id: str, bridge: TransformerBridge | None = None, *, revision: str | None = None,
              local_dir: str | Path | None = None, token: str | None = None) -> SiteArtifact:
    """Download a SITE folder from the Hub (``snapshot_download``; cached) and :func:`load_site` it."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, repo_type="model", revision=revision, token=token,
                                   local_dir=str(local_dir) if local_dir is not None else None,
                                   allow_patterns=list(FILES) + [IMAGE])
    except (OSError, ValueError) as err:
        raise HubError(f"downloading {repo_id} failed ({type(err).__name__}: {err}); it needs a network "
                       "(or a copy in the local Hugging Face cache)") from err
    return load_site(folder, bridge)


__all__ = [
    "FILES",
    "FORMAT",
    "HubError",
    "SiteArtifact",
    "SiteFolderError",
    "SiteModelMismatchError",
    "artifact_from_dir",
    "artifact_from_run",
    "head_map_markdown",
    "load_site",
    "model_card",
    "pull_site",
    "push_site",
    "save_site",
]

"""The measured parts of a head card: what a head writes, where it looks, what it does.

* **What it writes** (:func:`direct_logit_attribution`): the head's task embedding ``t[l, h]``
  through its output projection ``W_O[l, h]`` (and, on Gemma, through the post-attention norm
  linearised at the layer's mean output, as
  :func:`~site_interp.baselines.function_vectors.function_vector_from_heads` does), then through
  the final norm *linearised as its gain alone* (its 1/RMS factor is one positive number per
  vector and changes no ranking) and the unembedding ``W_U`` (no bias): the tokens it promotes
  and suppresses, per task.
* **Where it looks** (:func:`attention_sample`): the attention pattern of every head at the last
  token of one N-shot prompt of a task (``get_act_name("pattern", layer)``, ``[batch, head, q, k]``),
  with each prompt token's role (which demonstration, input or answer, or the query).
* **What it does** (:func:`head_effects`): first-token accuracy and answer log-probability on a
  task's 0-shot test prompts with only this head patched (alpha one-hot) and with this head
  removed from SITE (SITE's alphas, this one zeroed), beside 0-shot and full SITE; scored by
  :class:`~site_interp.scoring.LastTokenScorer` with per-row alphas.

Results are cached as keyed JSON artifacts (:func:`~site_interp.artifacts.save_json_artifact`),
so a card computed once opens instantly next time and a stale cache is refused, not reused.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from site_interp.artifacts import load_json_if_valid, save_json_artifact
from site_interp.baselines.function_vectors import function_vector_from_heads
from site_interp.errors import ConfigError
from site_interp.hooks import HookFn
from site_interp.loading import model_context, model_device
from site_interp.pipeline import model_id
from site_interp.prompts import DEFAULT_TEMPLATE, PromptTemplate, encode, left_pad, pad_id, sample_demos, zero_shot_batch
from site_interp.scoring import LastTokenScorer
from site_interp.tasks.core import Example, Task, TaskError

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

CONDITIONS = ("0-shot", "only this head", "SITE without this head", "SITE")
"""The four rows of a head's effect table, in order."""


@dataclass(frozen=True)
class CardConfig:
    """How the measured parts of head cards are computed."""

    top_tokens: int = 8
    """Tokens listed per direction (promoted, suppressed) in the direct logit attribution."""
    n_shots: int = 5
    """Demonstrations in the sample prompt whose attention pattern is shown."""
    n_test: int = 24
    """Test queries (the first ones of the test split) for the patch / removal effects."""
    seed: int = 0
    """Seed of the sample prompt's query and demonstrations."""
    chunk: int = 128
    """Rows per scoring chunk."""

    def __post_init__(self) -> None:
        for name in ("top_tokens", "n_test", "chunk"):
            if getattr(self, name) < 1:
                raise ConfigError(f"CardConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.n_shots < 0:
            raise ConfigError(f"CardConfig.n_shots must be >= 0, got {self.n_shots}")

    def to_dict(self) -> dict:
        return asdict(self)


def tensor_digest(x: Tensor) -> str:
    """A short hash of a tensor's values: cached effects are keyed by the alphas and embedding used."""
    data = x.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return hashlib.sha256(data + str(tuple(x.shape)).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- what it writes


def _special_ids(bridge: TransformerBridge) -> list[int]:
    """Ids of special tokens: the tokenizer's own, and added tokens marked special (Gemma's
    ``<unusedN>`` placeholders are), which no prompt of ours ever produces."""
    tok = bridge.tokenizer
    ids = set(getattr(tok, "all_special_ids", []) or [])
    ids |= {i for i, t in (getattr(tok, "added_tokens_decoder", None) or {}).items() if getattr(t, "special", False)}
    return sorted(i for i in ids if i < bridge.cfg.d_vocab)


@torch.no_grad()
def direct_logit_attribution(
    bridge: TransformerBridge, embeddings: dict[str, Float[Tensor, "layer head d_head"]], layer: int, head: int,
    k: int = 8,
) -> pd.DataFrame:
    """Top ``k`` promoted and suppressed tokens of head ``(layer, head)``'s injected vector per task.

    Rows: ``task, direction ("promoted" / "suppressed"), rank, token, token_id, logit``; the
    logit is ``(g * v) @ W_U`` with ``v`` the head's residual contribution and ``g`` the final
    norm's gain (see the module doc). Special tokens are left out.
    """
    vectors = torch.stack([function_vector_from_heads(bridge, t, [(layer, head)]) for t in embeddings.values()])
    param = next(bridge.ln_final.parameters())
    normed = bridge.ln_final(vectors.to(param.device, param.dtype)[:, None]).float().cpu()[:, 0]
    gained = normed * vectors.pow(2).mean(-1, keepdim=True).sqrt()  # undo the 1/RMS factor: gain only
    w_u = bridge.W_U.detach()
    logits = (gained.to(w_u.device, w_u.dtype) @ w_u).float().cpu()
    special = _special_ids(bridge)
    rows = []
    for i, task in enumerate(embeddings):
        for direction, sign in (("promoted", 1.0), ("suppressed", -1.0)):
            scores = sign * logits[i]
            if special:
                scores[special] = float("-inf")
            top = torch.topk(scores, min(k, scores.numel())).indices
            for rank, tok in enumerate(top.tolist(), 1):
                rows.append({"task": task, "direction": direction, "rank": rank,
                             "token": bridge.tokenizer.decode([tok]), "token_id": tok, "logit": float(logits[i, tok])})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- where it looks


@dataclass
class AttentionSample:
    """Attention of every head at the last token of one N-shot prompt of a task."""

    task: str
    """Task name."""
    tokens: list[str]
    """The prompt's tokens, decoded one by one (BOS first)."""
    roles: list[str]
    """Each token's role: ``bos``, ``demo i input``, ``demo i answer``, ``separator``, ``query``."""
    pattern: Float[Tensor, "layer head key"]
    """Attention weights of the last query position over the prompt's tokens."""
    text: str
    """The prompt."""

    def head(self, layer: int, head: int) -> Float[Tensor, " key"]:
        return self.pattern[layer, head]

    def to_dict(self) -> dict:
        return {"task": self.task, "tokens": self.tokens, "roles": self.roles, "text": self.text,
                "pattern": [[[round(float(v), 5) for v in row] for row in layer] for layer in self.pattern]}

    @classmethod
    def from_dict(cls, d: dict) -> AttentionSample:
        return cls(task=d["task"], tokens=d["tokens"], roles=d["roles"], text=d["text"],
                   pattern=torch.tensor(d["pattern"], dtype=torch.float32))


def make_pattern_row_hook(store: dict, key: object) -> HookFn:
    """Record the attention pattern (``[batch, head, q, k]``) of the last query position
    (``[batch, head, k]``, detached) into ``store[key]``; returns the pattern unchanged."""

    def hook(pattern: Float[Tensor, "batch head q k"], *, hook: HookPoint | None = None) -> Tensor:
        store[key] = pattern[:, :, -1, :].detach().to("cpu", torch.float32)
        return pattern

    return hook


def token_roles(
    text: str, demos: Sequence[Example], template: PromptTemplate, offsets: Sequence[tuple[int, int]], bos: bool
) -> list[str]:
    """Role of every token of ``text`` (BOS first when ``bos``) from its character ``offsets``:
    ``demo i input``, ``demo i answer``, ``separator`` or ``query``."""
    spans: list[tuple[int, int, str]] = []
    pos = 0
    for i, d in enumerate(demos, 1):
        q, a = template.query.format(input=d["input"]), template.answer_text(d["output"])
        spans += [(pos, pos + len(q), f"demo {i} input"), (pos + len(q), pos + len(q) + len(a), f"demo {i} answer")]
        pos += len(q) + len(a)
        spans.append((pos, pos + len(template.demo_separator), "separator"))
        pos += len(template.demo_separator)
    roles = ["bos"] if bos else []
    for start, _ in offsets:
        roles.append(next((label for s, e, label in spans if s <= start < e), "query"))
    return roles


@torch.no_grad()
def attention_sample(
    bridge: TransformerBridge, task: Task, n_shots: int = 5, seed: int = 0, *, template: PromptTemplate = DEFAULT_TEMPLATE
) -> AttentionSample:
    """Attention at the last token of one ``n_shots``-shot prompt of ``task``, every layer and head,
    in one forward. The query is a test example (train when there is no test split), chosen by
    ``seed``; its demonstrations come from train, as in the task embedding's prompts."""
    pool = task.test or task.train
    if not pool:
        raise TaskError(f"{task.name}: no examples to build a sample prompt from")
    rng = random.Random(seed)
    query = pool[rng.randrange(len(pool))]
    demos = sample_demos(task.train, n_shots, rng, exclude_input=query["input"], task=task.name) if n_shots else []
    text = template.prompt(query, demos)
    tok = bridge.tokenizer
    ids = encode(tok, text)
    context = model_context(bridge)
    if context is not None and len(ids) >= context:
        raise TaskError(f"{task.name}: the {n_shots}-shot sample prompt has {len(ids)} tokens, over the context; use fewer shots")
    tokens, mask = left_pad([ids], pad_id(tok), model_device(bridge))
    store: dict = {}
    n_layers = bridge.cfg.n_layers
    hooks = [(get_act_name("pattern", layer), make_pattern_row_hook(store, layer)) for layer in range(n_layers)]
    bridge.run_with_hooks(tokens, fwd_hooks=hooks, attention_mask=mask, logits_to_keep=1)
    pattern = torch.stack([store[layer][0] for layer in range(n_layers)])  # [layer, head, key]
    bos = tok.bos_token_id is not None and ids[:1] == [tok.bos_token_id]
    try:
        offsets = [tuple(o) for o in tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]
    except (NotImplementedError, TypeError, ValueError, KeyError):  # a slow tokenizer: no offsets
        offsets = []
    roles = token_roles(text, demos, template, offsets, bos) if len(offsets) + bos == len(ids) else ["prompt"] * len(ids)
    return AttentionSample(task=task.name, tokens=[tok.decode([i]) for i in ids], roles=roles, pattern=pattern, text=text)


def cached_attention(
    bridge: TransformerBridge, task: Task, config: CardConfig, cache: Path | None
) -> AttentionSample:
    """:func:`attention_sample`, read from / written to ``cache/attention.json`` when ``cache`` is given."""
    key = {"model_id": model_id(bridge), "task": task.name, "task_fingerprint": task.fingerprint(),
           "n_shots": config.n_shots, "seed": config.seed}
    path = cache / "attention.json" if cache is not None else None
    if path is not None:
        stored = load_json_if_valid(path, key)
        if stored is not None:
            return AttentionSample.from_dict(stored["sample"])
    sample = attention_sample(bridge, task, config.n_shots, config.seed)
    if path is not None:
        save_json_artifact(path, key, {"sample": sample.to_dict()}, seed=config.seed)
    return sample


# --------------------------------------------------------------------------- what it does


class EffectScorer:
    """A task's 0-shot test prompts held once (prefix cache); scores heads on demand."""

    def __init__(self, bridge: TransformerBridge, task: Task, t: Float[Tensor, "layer head d_head"],
                 alpha: Float[Tensor, "layer head"], config: CardConfig = CardConfig()):
        self.bridge, self.task, self.t, self.alpha, self.config = bridge, task, t.float(), alpha.float(), config
        self.batch = zero_shot_batch(bridge, task, "test", config.n_test)
        self._scorer: LastTokenScorer | None = None

    @property
    def scorer(self) -> LastTokenScorer:
        if self._scorer is None:
            self._scorer = LastTokenScorer(self.bridge, [self.batch])
        return self._scorer

    def key(self, layer: int, head: int) -> dict:
        return {"model_id": model_id(self.bridge), "task": self.task.name, "task_fingerprint": self.task.fingerprint(),
                "layer": layer, "head": head, "n_test": len(self.batch), "alpha": tensor_digest(self.alpha),
                "t": tensor_digest(self.t)}

    @torch.no_grad()
    def score(self, heads: Sequence[tuple[int, int]], *, progress: bool = False) -> dict[tuple[int, int], pd.DataFrame]:
        """Effect tables of ``heads`` (see :func:`head_effects`), all in one scoring pass."""
        n = len(self.batch)
        zero = torch.zeros_like(self.alpha)
        table = [zero, self.alpha]
        for layer, head in heads:
            only = zero.clone()
            only[layer, head] = 1.0
            removed = self.alpha.clone()
            removed[layer, head] = 0.0
            table += [only, removed]
        alphas = torch.stack(table)
        configs = torch.arange(len(table)).repeat_interleave(n)
        rows = torch.arange(n).repeat(len(table))
        out = self.scorer.score(rows, alphas, self.t[None], alpha_index=configs, t_index=torch.zeros_like(configs),
                                chunk=self.config.chunk, progress=progress, desc=f"head effects {self.task.name}")
        acc = out.correct.float().view(len(table), n).mean(1) * 100
        logp = out.target_logprob.view(len(table), n).mean(1)
        result = {}
        for j, (layer, head) in enumerate(heads):
            idx = [0, 2 + 2 * j, 3 + 2 * j, 1]
            result[(layer, head)] = pd.DataFrame({
                "task": self.task.name, "layer": layer, "head": head, "condition": list(CONDITIONS),
                "accuracy": [float(acc[i]) for i in idx], "answer_logprob": [float(logp[i]) for i in idx], "n": n,
            })
        return result


def head_effects(
    scorer: EffectScorer, heads: Sequence[tuple[int, int]], cache: Path | None = None, *, progress: bool = False
) -> dict[tuple[int, int], pd.DataFrame]:
    """Per head: first-token accuracy (%) and mean answer log-probability under :data:`CONDITIONS`
    on the task's first ``n_test`` test queries; cached per head as ``cache/effects_L{l}_H{h}.json``."""
    out: dict[tuple[int, int], pd.DataFrame] = {}
    todo = []
    for layer, head in dict.fromkeys(heads):
        path = cache / f"effects_L{layer}_H{head}.json" if cache is not None else None
        stored = load_json_if_valid(path, scorer.key(layer, head)) if path is not None else None
        if stored is not None:
            out[(layer, head)] = pd.DataFrame(stored["rows"])
        else:
            todo.append((layer, head))
    if todo:
        for lh, df in scorer.score(todo, progress=progress).items():
            out[lh] = df
            if cache is not None:
                save_json_artifact(cache / f"effects_L{lh[0]}_H{lh[1]}.json", scorer.key(*lh),
                                   {"rows": df.to_dict(orient="records")}, seed=scorer.config.seed)
    return {lh: out[lh] for lh in dict.fromkeys(heads)}


@dataclass
class HeadCard:
    """Everything known about one head: its four card parts (None where not computed, with why)."""

    layer: int
    """Layer."""
    head: int
    """Head."""
    task: str
    """Task of the attention sample and the effects."""
    alphas: pd.Series
    """Alpha in every task (grid order)."""
    threshold: float = 0.5
    """Threshold the alphas are coloured against."""
    dla: pd.DataFrame | None = None
    """Top promoted / suppressed tokens per task."""
    attention: AttentionSample | None = None
    """Attention of every head on a sample prompt of :attr:`task`."""
    effects: pd.DataFrame | None = None
    """Accuracy and answer log-probability with only this head / without it, on :attr:`task`."""
    errors: dict[str, str] = field(default_factory=dict)
    """Why a part is missing (``dla``, ``attention``, ``effects``)."""

    def note(self, part: str) -> str:
        return f"{part}: {self.errors.get(part, 'not computed')}"


__all__ = [
    "CONDITIONS",
    "AttentionSample",
    "CardConfig",
    "HeadCard",
    "EffectScorer",
    "attention_sample",
    "cached_attention",
    "direct_logit_attribution",
    "head_effects",
    "make_pattern_row_hook",
    "tensor_digest",
    "token_roles",
]

"""The floor model's arithmetic: what one forward of the model costs in matmul FLOPs.

Everything comes from the bridge's config (``n_layers``, ``d_model``, ``n_heads``,
``n_key_value_heads``, ``d_head``, ``d_mlp``, ``d_vocab``, ``gated_mlp``): no model names.
Only matrix products are counted (what :class:`torch.utils.flop_counter.FlopCounterMode`
counts: ``mm``/``addmm``/``bmm``), 2 FLOPs per multiply-add:

* weights, per token run (padding included: padded positions are computed too):
  Q and O projections ``d_model x (n_heads * d_head)``, K and V ``d_model x (n_kv_heads * d_head)``
  (grouped-query attention: fewer KV heads), the MLP (3 matrices ``d_model x d_mlp`` when gated,
  as in Gemma and Llama, else 2);
* attention, per row and layer: scores ``q_len x k_len x d_head`` and the weighted values again,
  for every query head (the eager attention repeats the KV heads), at the forward's real
  ``q_len`` (tokens run) and ``k_len`` (cached prefix + tokens run, padding included);
* the unembedding ``d_model x d_vocab``, only for the positions whose logits are computed
  (``logits_to_keep=1``: the last token of each row).

Training (``backward=True``) differentiates the loss with respect to the alphas only, with every
weight frozen: the backward pass computes gradients of the activations, never of the weights.
Each frozen linear layer's backward is then one matmul (grad_output @ W), the same FLOPs as its
forward; each attention product gets gradients for both operands, twice its forward. The
injection sits at every layer's ``hook_z`` (after layer 0's attention), so layer 0's Q/K/V
projections and attention have no backward; its O projection and MLP do. So the backward is
about the forward's matmul FLOPs again (a little less: layer 0's attention part; a little more:
twice the attention products of the later layers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Dims:
    """The sizes of the model that set its FLOPs (from ``bridge.cfg``)."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    mlp_mats: int
    """Matrices in the MLP: 3 when gated (gate, up, down), else 2."""
    dtype: str

    @classmethod
    def of(cls, bridge) -> "Dims":
        cfg = bridge.cfg
        kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        return cls(n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=kv,
                   d_head=cfg.d_head, d_mlp=cfg.d_mlp, d_vocab=cfg.d_vocab,
                   mlp_mats=3 if getattr(cfg, "gated_mlp", False) else 2, dtype=str(cfg.dtype).replace("torch.", ""))

    def weight_shapes(self) -> list[tuple[str, int, int]]:
        """(name, in, out) of every weight matmul of one layer, in forward order."""
        q, kv = self.n_heads * self.d_head, self.n_kv_heads * self.d_head
        mlp_in = [("mlp_in", self.d_model, self.d_mlp)] * (self.mlp_mats - 1)
        return [("q", self.d_model, q), ("k", self.d_model, kv), ("v", self.d_model, kv), ("o", q, self.d_model),
                *mlp_in, ("mlp_out", self.d_mlp, self.d_model)]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Forward:
    """One forward of the model, as a stage runs it (``count`` identical ones)."""

    rows: int
    """Batch rows."""
    q_len: int
    """Positions run per row (the padded prompt width, or 1 over a prefix cache / in generation)."""
    k_len: int
    """Keys each position attends over: cached prefix + positions run (padded width)."""
    logits_rows: int
    """Positions whose logits are computed (rows x 1 with ``logits_to_keep=1``)."""
    backward: bool = False
    """Followed by a backward pass to the activations (training)."""
    real_tokens: int = 0
    """Positions run that are not padding."""
    count: int = 1

    @property
    def tokens(self) -> int:
        """Positions run, padding included (rows x q_len)."""
        return self.rows * self.q_len


# ----------------------------------------------------------------------------- FLOPs


def matmuls(dims: Dims, f: Forward) -> list[tuple[str, tuple[int, ...], int]]:
    """Every matmul of one forward (and its backward): (kind, shape, FLOPs), with ``count`` applied.

    Kinds and shapes: ``("w", (m, k, n))`` a weight matmul ``[m, k] @ [k, n]`` (the unembedding
    too, with k = d_model, n = d_vocab); ``("wgrad", (m, k, n))`` its backward to the input,
    ``[m, n] @ [n, k]``; ``("attn", (batch, q_len, k_len, d_head))`` one layer's two attention
    products (their backward is given the same shape: it is small next to the weights in training).
    """
    out: list[tuple[str, tuple[int, ...], int]] = []
    m = f.tokens
    attn_shape = (f.rows * dims.n_heads, f.q_len, f.k_len, dims.d_head)
    attn = 2 * 2 * f.rows * dims.n_heads * f.q_len * f.k_len * dims.d_head  # scores + values
    for name, k, n in dims.weight_shapes():
        fl = 2 * m * k * n
        out.append(("w", (m, k, n), fl * dims.n_layers * f.count))
        if f.backward:  # grad of the input only; layer 0's q/k/v see no gradient
            layers = dims.n_layers - 1 if name in ("q", "k", "v") else dims.n_layers
            out.append(("wgrad", (m, k, n), fl * layers * f.count))
    out.append(("attn", attn_shape, attn * dims.n_layers * f.count))
    if f.backward:  # both operands of both products, layers 1..L-1
        out.append(("attn", attn_shape, 2 * attn * (dims.n_layers - 1) * f.count))
    if f.logits_rows:
        shape = (f.logits_rows, dims.d_model, dims.d_vocab)
        fl = 2 * f.logits_rows * dims.d_model * dims.d_vocab
        out.append(("w", shape, fl * f.count))
        if f.backward:
            out.append(("wgrad", shape, fl * f.count))
    return out


def forward_flops(dims: Dims, f: Forward) -> int:
    """Matmul FLOPs of ``f`` (forward, plus the backward to the activations when ``f.backward``)."""
    return sum(fl for _, _, fl in matmuls(dims, f))


def merge(forwards: list[Forward]) -> list[Forward]:
    """Identical forwards folded into one with a count (same totals, fewer entries)."""
    seen: dict[tuple, int] = {}
    for f in forwards:
        key = (f.rows, f.q_len, f.k_len, f.logits_rows, f.backward, f.real_tokens)
        seen[key] = seen.get(key, 0) + f.count
    return [Forward(*key, count=n) for key, n in seen.items()]


def totals(dims: Dims, forwards: list[Forward]) -> dict:
    """Rows, tokens (padded and real), forwards and FLOPs of a list of forwards."""
    return {
        "forwards": sum(f.count for f in forwards),
        "rows": sum(f.rows * f.count for f in forwards),
        "tokens": sum(f.tokens * f.count for f in forwards),
        "real_tokens": sum(f.real_tokens * f.count for f in forwards),
        "flops": sum(forward_flops(dims, f) for f in forwards),
    }


__all__ = ["Dims", "Forward", "forward_flops", "matmuls", "merge", "totals"]

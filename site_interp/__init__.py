"""site_interp: SITE (soft head-selection for ICL-derived task embeddings) on TransformerLens 4.

The method, one module per stage (``docs/design.md`` maps every module); studies live in
:mod:`site_interp.studies`, baselines in :mod:`site_interp.baselines`, figures in
:mod:`site_interp.plots` (importing this package loads no plotting library)::

    from site_interp import load_model, builtin_task, compute_task_embedding, train_site, evaluate

    bridge = load_model()                          # gemma-3-270m, embedded, offline
    task = builtin_task("country_capital")
    emb = compute_task_embedding(bridge, task)     # t[layer, head, d_head]
    res = train_site(bridge, task, emb)            # alpha[layer, head], best validation step
    ev = evaluate(bridge, task, standard_methods(emb.t, res.alpha))
    print(ev.summary())
"""

from site_interp.artifacts import ArtifactMismatchError
from site_interp.embeddings import EmbeddingConfig, TaskEmbedding, compute_task_embedding
from site_interp.errors import UserError
from site_interp.evaluation import EvalConfig, Method, TaskEvaluation, evaluate, exact_match, standard_methods
from site_interp.hooks import capture_hooks, injection_hooks, make_capture_hook, make_soft_injection_hook
from site_interp.loading import DEFAULT_MODEL, ModelError, available_models, load_model, tiny_bridge
from site_interp.pipeline import RunConfig, TaskRun, run_task, run_tasks
from site_interp.prompts import DEFAULT_TEMPLATE, PromptTemplate, build_prompts
from site_interp.tasks import Task, TaskError, builtin_task, load_json_task, load_task, load_task_dir, resolve_tasks
from site_interp.training import SiteConfig, SiteResult, train_site, train_site_many, uniform_alpha

__version__ = "0.1.0"

__all__ = [
    "ArtifactMismatchError",
    "DEFAULT_MODEL",
    "DEFAULT_TEMPLATE",
    "EmbeddingConfig",
    "EvalConfig",
    "Method",
    "ModelError",
    "PromptTemplate",
    "RunConfig",
    "SiteConfig",
    "SiteResult",
    "Task",
    "TaskEmbedding",
    "TaskError",
    "TaskEvaluation",
    "TaskRun",
    "UserError",
    "available_models",
    "build_prompts",
    "builtin_task",
    "capture_hooks",
    "compute_task_embedding",
    "evaluate",
    "exact_match",
    "injection_hooks",
    "load_json_task",
    "load_model",
    "load_task",
    "load_task_dir",
    "make_capture_hook",
    "make_soft_injection_hook",
    "resolve_tasks",
    "run_task",
    "run_tasks",
    "standard_methods",
    "tiny_bridge",
    "train_site",
    "train_site_many",
    "uniform_alpha",
]

"""Which tasks have answers whose first token (after the template's space) is whitespace only.

    python benchmarks/answer_tokens.py [--data-dir ../shared/data/fv57] [--models gemma-3-270m smollm2-135m]

For each model: the tasks and how many of their examples (all splits) start with a
whitespace-only token, i.e. the examples whose target ``prompts.answer_start`` moves past it.
"""

from __future__ import annotations

import argparse

from site_interp.loading import load_model
from site_interp.prompts import DEFAULT_TEMPLATE, answer_start
from site_interp.tasks import load_task_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="../shared/data/fv57")
    p.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    args = p.parse_args()
    tasks = load_task_dir(args.data_dir)
    for name in args.models:
        tok = load_model(name, device="cpu").tokenizer
        counts = {}
        for task in tasks.values():
            examples = task.train + task.valid + task.test
            n = sum(bool(answer_start(tok, DEFAULT_TEMPLATE.prompt(e), DEFAULT_TEMPLATE.answer_text(e["output"]))[0])
                    for e in examples)
            if n:
                counts[task.name] = f"{n}/{len(examples)}"
        print(f"{name}: {counts or 'none'}")


if __name__ == "__main__":
    main()

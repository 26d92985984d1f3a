"""``dclm``: the 22 DCLM-core tasks scored the llm-foundry way (``dclm_dir``, ``evals/dclm.py``)."""

from __future__ import annotations

from pathlib import Path

from evals.suites import EvalSuite


def run(ctx) -> list[dict]:
    from evals.dclm import run_core
    from evals.lmeval import max_length

    return run_core(ctx.model, ctx.tokenizer, Path(ctx.input), device=ctx.device, max_len=max_length(ctx.model),
                    limit=ctx.options.get("dclm_limit") or None, seed=ctx.seed, batch_size=ctx.batch_size)


def find_in(folder: Path) -> dict[str, str]:
    return {"dclm_dir": str(folder / "dclm_core")} if (folder / "dclm_core" / "eval_meta_data.csv").is_file() else {}


SPECS = (
    EvalSuite("dclm", "DCLM-core (seeded sample of dclm_limit rows per task): acc, centered_acc, gold_bpb, Core v1/v2", run,
              path_key="dclm_dir", reads=("dclm_dir", "dclm_limit"), higher_is_better=("acc", "centered_acc", "core_v1", "core_v2"),
              find_in=find_in, order=40),
)

"""The registries: every entry's config keys are declared, and a toy strategy, export format,
eval suite — each one file, loaded through ``STRATA_PLUGINS`` — reach the CLI, the config schema,
the launchpad and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evals.suites import REGISTRY as SUITES
from pipeline.config import config_from_dict, is_config_key
from pipeline.errors import StrataInputError
from pipeline.export.formats import REGISTRY as FORMATS
from pipeline.ordering.strategies import REGISTRY as STRATEGIES

ROOT = Path(__file__).resolve().parents[1]

TOY_STRATEGY = '''
"""toy_reverse: the packing order backwards, in blocks of shard_docs sequences."""
import numpy as np

from pipeline.ordering.strategies import StrategySpec


def order(features, params, seed):
    return np.arange(features.n_sequences, dtype=np.int64)[::-1]


SPECS = (StrategySpec("toy_reverse", "sequence", "the packing order backwards", seed_free=True, reads=("shard_docs",), order=order),)
'''

TOY_FORMAT = '''
"""toy_ids: the sequence ids in training order, one per line."""
from pipeline.export.formats import ExportFormat


def write(stream, out, meta, *, global_batch, world_size, progress=None):
    path = out / "ids.txt"
    path.write_text("".join(f"{i}\\n" for i in stream.order))
    return [path]


SPECS = (ExportFormat("toy_ids", "sequence ids, one per line", write, reads=("checkpoint_every",)),)
'''

TOY_SUITE = '''
"""toy: the number of model parameters as a score (higher is better)."""
from evals.suites import EvalSuite


def run(ctx):
    n = sum(p.numel() for p in ctx.model.parameters())
    return [{"suite": "toy", "task": "all", "metric": "toy_score", "value": float(n), "n": 1}]


SPECS = (EvalSuite("toy", "parameter count", run, reads=("embed_batch_size",), higher_is_better=("toy_score",),
                   locate=lambda cfg, layout: layout.root),)
'''

# Runs in a fresh interpreter with STRATA_PLUGINS set, as `strata` or `dagster dev` would: the
# registries, the config schema and the assets' dg.Config classes are built with the toys in them.
PROBE = '''
import json, sys
from pathlib import Path

import numpy as np
import polars as pl
import torch

tmp = Path(sys.argv[1])
out = {}

# CLI: the choices of `strata schedule --strategy` and `strata export --format`, `strata list`; run two toys through it
from assets.cli import build_parser, main, registry_rows

out["listed"] = {f: [r[0] for r in registry_rows(f)] for f in ("strategies", "formats", "suites")}

sub = next(a for a in build_parser()._actions if a.dest == "command").choices
out["schedule_choices"] = list(next(a for a in sub["schedule"]._actions if a.dest == "strategy").choices)
out["export_choices"] = list(next(a for a in sub["export"]._actions if a.dest == "format").choices)
seg = pl.DataFrame({"sequence_id": [0, 1, 2, 3], "doc_id": [0, 1, 2, 3], "cluster": [0, 1, 0, 1],
                    "doc_length": [5, 5, 5, 5], "n_tokens": [5, 5, 5, 5]})
seg.write_parquet(tmp / "seg.parquet")
out["schedule_rc"] = main(["schedule", str(tmp / "seg.parquet"), "--strategy", "toy_reverse", "--out", str(tmp / "order.parquet")])
out["scheduled"] = pl.read_parquet(tmp / "order.parquet")["sequence_id"].to_list()

from pipeline.export import export_stream, stream_from_arrays

segments = pl.DataFrame({"sequence_id": [0, 1, 2, 3], "doc_id": [0, 1, 2, 3], "seq_token_start": [0] * 4, "n_tokens": [4] * 4,
                         "doc_token_start": [0] * 4})
stream = stream_from_arrays(np.arange(20, dtype=np.uint16), np.arange(0, 21, 5), segments, np.array([2, 0, 3, 1]), 4, eos_id=1, pad_id=0)
info = export_stream(stream, "toy_ids", tmp / "exported", global_batch=2)
out["exported"] = (tmp / "exported" / "ids.txt").read_text().split()

# config schema
from pipeline.config import config_from_dict

cfg = config_from_dict({"strategies": ["random", "toy_reverse"], "export": {"formats": ["numpy", "toy_ids"]}})
out["config"] = [cfg.strategies, cfg.export.formats]

# launchpad: the keys each toy reads become fields of its asset's dg.Config
from assets.evaluations import evaluations
from assets.exports import exports
from assets.orderings import orderings
from assets.params import PARAMS

out["launchpad"] = {a.op.name: sorted(a.op.config_schema.as_field().config_type.fields) for a in (orderings, exports, evaluations)}
out["params"] = {k: list(PARAMS[k]) for k in ("orderings", "exports", "evaluations")}

# the evaluation
from evals.run import evaluate

rows = evaluate(torch.nn.Linear(3, 2), None, {"toy": tmp}, limit=1, device="cpu", work_dir=tmp / "work")

# report: the suite's metric in the ablation table, its direction in the paired differences
from pipeline.reports.stats import delta_table
from evals.suites import is_higher_better as higher_is_better
from pipeline.reports.tables import ablation_table, render_report

values = {"random": (8.0, 9.0, 10.0), "toy_reverse": (9.5, 9.9, 11.2)}
units = pl.DataFrame([{"strategy": s, "seed": seed, "metric": "toy/all/toy_score", "unit": "all", "value": v[seed]}
                      for s, v in values.items() for seed in (0, 1, 2)])
out["rows"] = rows
out["higher_is_better"] = higher_is_better("toy/all/toy_score")
deltas = delta_table(units, "random", 200, 0, higher_is_better)
out["better"] = deltas.filter(pl.col("strategy") == "toy_reverse")["better"].to_list()
out["report"] = render_report(ablation_table(units), strategies=["random", "toy_reverse"], deltas=deltas)
print(json.dumps(out))
'''


def test_every_key_an_entry_reads_is_declared():
    """Every config key an ordering strategy, export format or eval suite reads is a StrataConfig
    field (so it validates, versions its asset and appears in the launchpad)."""
    entries = [*STRATEGIES.entries().values(), *FORMATS.entries().values(), *SUITES.entries().values()]
    assert len(entries) >= 14 + 4 + 4
    keys = {e.name: [*e.reads, *filter(None, [getattr(e, "path_key", None)])] for e in entries}
    undeclared = {name: k for name, ks in keys.items() for k in ks if not is_config_key(k)}
    assert undeclared == {}, "declare these keys in pipeline/config.py StrataConfig"
    for suite in SUITES.entries().values():
        assert suite.path_key is None or suite.path_key in suite.reads


def test_every_claim_reads_declared_keys_and_inputs():
    """Every config key a claim reads is a key the claims stage's params read, every input it names
    a ClaimData field; ``strata list claims`` lists them in the claims' order, each with its paper."""
    from dataclasses import fields

    from assets.cli import REGISTRIES, registry_rows
    from pipeline.claims.measure import ClaimData
    from pipeline.claims.papers import REGISTRY as CLAIMS
    from pipeline.claims.papers import ordered
    from pipeline.claims.stage import ClaimsParams

    claims = ordered()
    assert len(claims) >= 10 and {c.paper for c in claims} == {"Don't Shuffle, Optimize", "Diversity-ordered training",
                                                                "TerRIFIC curricula", "Packing & shuffling"}
    # every key a claim reads is a config key the claims stage's params read (ClaimsParams)
    read = set(ClaimsParams.reads())
    assert {c.name: [k for k in c.reads if not is_config_key(k) or k not in read] for c in claims} == {c.name: [] for c in claims}
    assert {"bootstrap_samples", "seed"} <= read  # what every claim's interval reads
    inputs = {f.name for f in fields(ClaimData)}
    assert {c.name: sorted(set(c.inputs) - inputs) for c in claims} == {c.name: [] for c in claims}
    assert all(c.inputs for c in claims) and CLAIMS.get("dso_stable_rank").inputs == ("stable_rank",)
    assert "claims" in REGISTRIES and [r[0] for r in registry_rows("claims")] == [c.name for c in claims]
    assert registry_rows("claims")[0][1].startswith("claim of Don't Shuffle, Optimize")


def test_reading_the_registries_imports_no_heavy_dependency():
    """Reading every registry (as the config's validation does) imports none of pipeline/heavy.py's
    list: spec modules import their stage's code at their top, and that code keeps its heavy
    dependencies to the functions that use them."""
    code = ("import sys; from pipeline.config import StrataConfig; StrataConfig(); "
            "from pipeline.registry import EXPORT_FORMATS, FAMILIES, STRATEGIES; from evals.suites import REGISTRY; "
            "[r.entries() for r in (EXPORT_FORMATS, FAMILIES, STRATEGIES, REGISTRY)]; from pipeline.heavy import is_heavy; "
            "print(sorted(m for m in sys.modules if is_heavy(m)))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=ROOT).stdout.strip()
    assert out == "[]"


def test_unknown_names_are_refused_with_the_registry_listed():
    with pytest.raises(StrataInputError, match="unknown export formats \\['tfrecord'\\].*'numpy'"):
        config_from_dict({"export": {"formats": ["tfrecord"]}})
    with pytest.raises(StrataInputError, match="unknown eval suite 'mmlu'.*wikitext"):
        SUITES.get("mmlu")


def test_toy_strategy_format_and_suite_from_one_file_each(tmp_path):
    files = []
    for name, text in (("toy_strategy", TOY_STRATEGY), ("toy_format", TOY_FORMAT), ("toy_suite", TOY_SUITE)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
        files.append(str(tmp_path / f"{name}.py"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STRATA_PLUGINS": os.pathsep.join(files)}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    assert all(t in out["listed"][f] for f, t in (("strategies", "toy_reverse"), ("formats", "toy_ids"), ("suites", "toy")))
    assert "toy_reverse" in out["schedule_choices"] and "greedy" in out["schedule_choices"]
    assert "toy_ids" in out["export_choices"] and "numpy" in out["export_choices"]
    assert out["schedule_rc"] == 0 and out["scheduled"] == [3, 2, 1, 0]
    assert out["exported"] == ["2", "0", "3", "1"]
    assert out["config"] == [["random", "toy_reverse"], ["numpy", "toy_ids"]]
    # each toy's key joins its asset's parameters and, read by no other asset, its launchpad fields
    assert "shard_docs" in out["params"]["orderings"] and "shard_docs" in out["launchpad"]["orderings"]
    assert "checkpoint_every" in out["launchpad"]["exports"]
    assert "embed_batch_size" in out["launchpad"]["evaluations"]
    assert out["rows"] == [{"suite": "toy", "task": "all", "metric": "toy_score", "value": 8.0, "n": 1}]
    assert out["higher_is_better"] is True and out["better"] == [True]  # a rise of the toy's score counts as better
    report = out["report"]
    row = next(line for line in report.splitlines() if line.startswith("| toy/all/toy_score |") and "±" in line)
    assert "9.0000 ± 1.0000" in row and "10.2000 ± 0.8888" in row  # mean ± std over the seeds, per strategy
    assert "| toy/all/toy_score | **+1.2000 [" in report  # toy_reverse - random in the differences table


def test_without_plugins_the_toys_are_absent():
    from assets.params import PARAM_CLASSES

    assert "toy_reverse" not in STRATEGIES.names() and "toy_ids" not in FORMATS.names() and "toy" not in SUITES.names()
    assert "shard_docs" not in PARAM_CLASSES["orderings"].model_fields
    with pytest.raises(StrataInputError, match="unknown strategies \\['toy_reverse'\\]"):
        config_from_dict({"strategies": ["toy_reverse"]})


def test_the_architecture_pages_worked_example_runs(tmp_path, monkeypatch):
    """docs/architecture.md's example strategy, as written there, is one file that the config, the
    CLI and ``run_strategy`` take."""
    import re

    import numpy as np
    import polars as pl

    from assets.cli import build_parser
    from pipeline.ordering.engine import OrderParams, run_strategy

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    code = re.search(r"## Worked example.*?```python\n(.*?)```", page, flags=re.S).group(1)
    (tmp_path / "shortest_first.py").write_text(code)
    monkeypatch.setenv("STRATA_PLUGINS", str(tmp_path / "shortest_first.py"))
    STRATEGIES.reload()
    try:
        assert config_from_dict({"strategies": ["random", "shortest_first"]}).strategies[1] == "shortest_first"
        sub = next(a for a in build_parser()._actions if a.dest == "command").choices
        assert "shortest_first" in next(a for a in sub["schedule"]._actions if a.dest == "strategy").choices
        rng = np.random.default_rng(0)
        lengths = rng.integers(2, 90, 300)
        docs = pl.DataFrame({"doc_id": np.arange(300), "cluster": rng.integers(0, 4, 300), "n_tokens": lengths})
        seg = pl.DataFrame({"sequence_id": np.arange(300), "doc_id": np.arange(300), "seq_token_start": np.zeros(300, np.int64),
                            "n_tokens": lengths, "doc_token_start": np.zeros(300, np.int64)})  # one document per sequence
        res = run_strategy("shortest_first", docs, seg, 64, OrderParams(), seed=3)
        filled = seg.group_by("sequence_id").agg(pl.col("n_tokens").sum())
        by_id = dict(zip(filled["sequence_id"].to_list(), filled["n_tokens"].to_list()))
        got = [by_id[s] for s in res.order["sequence_id"].to_list()]
        assert sorted(res.order["sequence_id"].to_list()) == sorted(by_id) and got == sorted(got) and got[0] < got[-1]
    finally:
        monkeypatch.delenv("STRATA_PLUGINS")
        STRATEGIES.reload()
    assert "shortest_first" not in STRATEGIES.names()


def test_a_plugin_may_not_reuse_a_name_and_must_exist(tmp_path, monkeypatch):
    (tmp_path / "again.py").write_text(textwrap.dedent('''
        from pipeline.ordering.strategies import StrategySpec

        SPECS = (StrategySpec("random", "sequence", "a second random", seed_free=False, order=lambda f, p, s: None),)
    '''))
    try:
        monkeypatch.setenv("STRATA_PLUGINS", str(tmp_path / "again.py"))
        STRATEGIES.reload()
        with pytest.raises(StrataInputError, match="more than one ordering strategy is named 'random'.*strata_plugin_again"):
            STRATEGIES.entries()
        monkeypatch.setenv("STRATA_PLUGINS", str(tmp_path / "missing.py"))
        STRATEGIES.reload()
        with pytest.raises(StrataInputError, match="plugin file not found"):
            STRATEGIES.names()
    finally:
        monkeypatch.delenv("STRATA_PLUGINS")
        STRATEGIES.reload()
    assert STRATEGIES.get("random").description == "seeded uniform permutation of the sequences"


TOY_FAMILIES = '''
    """toy_parity: tokens of even and of odd clusters; toy_top: classes of the largest cluster's share."""
    import numpy as np

    from pipeline.ordering.families import SequenceFamily, TokenFamily


    class Parity(TokenFamily):
        name = "toy_parity"
        description = "tokens of even and of odd clusters"
        repaired = True
        diagnosed = "toy_parity"

        def tokens(self, features):
            from pipeline.ordering.features import Csr

            c = features.clusters
            m = c.n_rows
            rows = np.repeat(np.arange(m), np.diff(c.indptr))
            dense = np.bincount(rows * 2 + c.indices % 2, weights=c.data, minlength=2 * m).reshape(m, 2)
            r, g = np.nonzero(dense)
            return Csr(np.searchsorted(r, np.arange(m + 1)).astype(np.int64), g.astype(np.int64), dense[r, g], 2)

        def composition(self, schedule):
            from pipeline.ordering.composition import composition

            c = schedule.clusters
            return composition(c.seq, c.group % 2, c.tokens, c.n_sequences, 2)


    class Top(SequenceFamily):
        name = "toy_top"
        description = "quantile classes of the share of a sequence's largest cluster"

        def values(self, features):
            c = features.clusters
            return np.maximum.reduceat(c.data, c.indptr[:-1]) / features.lengths


    SPECS = (Parity(), Top())
'''


@pytest.fixture()
def toy_families(tmp_path, monkeypatch):
    """The families' registry with the toys of one plugin file in it (and without them after)."""
    from pipeline.ordering.families import REGISTRY as FAMILIES

    (tmp_path / "toy_families.py").write_text(textwrap.dedent(TOY_FAMILIES))
    monkeypatch.setenv("STRATA_PLUGINS", str(tmp_path / "toy_families.py"))
    FAMILIES.reload()
    yield FAMILIES
    monkeypatch.delenv("STRATA_PLUGINS")
    FAMILIES.reload()
    assert "toy_parity" not in FAMILIES.names()


def _parity_instance():
    import numpy as np

    from pipeline.ordering.features import sequence_features
    from pipeline.packing.pack import pack_concat

    rng = np.random.default_rng(4)
    n = 1500
    cluster = rng.choice(6, n, p=[0.35, 0.05, 0.3, 0.1, 0.15, 0.05])  # 80% of the documents in even clusters
    length = rng.integers(5, 40, n)
    seg = pack_concat(rng.permutation(n), length, 64).segments
    d = seg["doc_id"].to_numpy()
    f = sequence_features(seg["sequence_id"].to_numpy(), cluster[d], length[d], seg["n_tokens"].to_numpy(), 8, d)
    return f, seg, cluster, length


def test_a_toy_family_from_one_file_reaches_greedy_repair_diagnostics_and_config(toy_families):
    import numpy as np

    from pipeline.ordering.composition import composition
    from pipeline.ordering.engine import OrderParams, sequence_order
    from pipeline.ordering.families import REGISTRY as FAMILIES
    from pipeline.ordering.families import repaired
    from pipeline.ordering.greedy import Objective
    from pipeline.ordering.repair import repair_batches
    from pipeline.reports import diagnostics as D

    f, seg, cluster, length = _parity_instance()
    parity = FAMILIES.get("toy_parity").tokens(f)
    assert np.array_equal(parity.column_totals(), [f.clusters.column_totals()[0::2].sum(), f.clusters.column_totals()[1::2].sum()])
    # the greedy's matrix: the family's columns, scaled by sqrt(weight); a sequence family's classes
    chars = Objective.named("custom", families=["cluster", "toy_parity:4", "toy_top:1:3"]).matrix(f)
    lo, hi = chars.family_columns["toy_parity"]
    assert hi - lo == 2 and np.allclose(chars.x.take_rows(np.arange(f.n_sequences)).column_totals()[lo:hi], 2 * parity.column_totals())
    lo, hi = chars.family_columns["toy_top"]
    assert hi - lo == 3 and lo >= chars.n_token_cols  # a sequence family: after the token columns
    # ... and it steers the order: balancing parity alone holds it per batch far better than a shuffle
    rows = sequence_order("greedy", f, OrderParams(objective="custom", families=("toy_parity",), greedy_repair=False), 0)
    shuffled = np.random.default_rng(0).permutation(f.n_sequences)

    def parity_dev(order: np.ndarray, batch: int = 8) -> np.ndarray:
        position = np.empty_like(order)
        position[order] = np.arange(order.size)
        comp = composition(np.repeat(np.arange(parity.n_rows), np.diff(parity.indptr)), parity.indices, parity.data,
                             parity.n_rows, 2)
        return D.batch_deviations(comp, position, batch)

    assert parity_dev(rows).mean() < 0.5 * parity_dev(shuffled).mean()
    # the repair scores it: alone, it lowers a shuffle's worst parity batch; by default it joins clusters and bins
    assert [s.name for s in repaired()] == ["cluster", "length_bin", "toy_parity"]
    fixed, swaps = repair_batches(shuffled, f, 8, families=[FAMILIES.get("toy_parity")])
    assert swaps > 0 and parity_dev(fixed).max() < parity_dev(shuffled).max()
    both = [FAMILIES.get("cluster"), FAMILIES.get("length_bin")]
    assert np.array_equal(repair_batches(shuffled, f, 8)[0],
                          repair_batches(shuffled, f, 8, families=[*both, FAMILIES.get("toy_parity")])[0])
    # the diagnostics score it, as the deviations of its composition
    ids = f.sequence_ids[shuffled]
    schedule = D.prepare(seg, ids, cluster, length, length_bins=8)
    got = {(m, s): v for _, m, s, v in D.batch_rows("x", schedule, (8,)) + D.prefix_rows("x", schedule)}
    assert got[("batch_dev_toy_parity_max", "batch=8")] == pytest.approx(parity_dev(shuffled).max())
    assert ("batch_dev_clusters_max", "batch=8") in got and any(m == "prefix_error_toy_parity" for m, _ in got)
    # the config: classes only for a sequence family
    assert config_from_dict({"objective": "custom", "families": ["cluster", "toy_top:1:3"]}).families[1] == "toy_top:1:3"
    with pytest.raises(StrataInputError, match="token family 'toy_parity' takes no classes"):
        config_from_dict({"objective": "custom", "families": ["cluster", "toy_parity:1:3"]})


def test_without_the_plugin_a_toy_family_is_a_documents_column():
    from pipeline.ordering.families import REGISTRY as FAMILIES
    from pipeline.ordering.families import ColumnFamily, spec_of

    assert "toy_top" not in FAMILIES.names() and isinstance(spec_of("toy_top"), ColumnFamily)
    with pytest.raises(StrataInputError, match="token family 'toy_top' takes no classes"):
        config_from_dict({"objective": "custom", "families": ["cluster", "toy_top:1:3"]})


def test_the_architecture_pages_family_example_runs(tmp_path, monkeypatch):
    """docs/architecture.md's example family, as written there, is one file that the config, the
    greedy's matrix and the diagnostics take."""
    import re

    import numpy as np

    from pipeline.ordering.families import REGISTRY as FAMILIES
    from pipeline.ordering.greedy import Objective
    from pipeline.reports import diagnostics as D

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    code = re.search(r"## Worked example: adding a characteristic family.*?```python\n(.*?)```", page, flags=re.S).group(1)
    (tmp_path / "long_docs.py").write_text(code)
    monkeypatch.setenv("STRATA_PLUGINS", str(tmp_path / "long_docs.py"))
    FAMILIES.reload()
    try:
        custom = config_from_dict({"objective": "custom", "families": ["cluster", "length_bin", "long_docs:0.5"]})
        assert custom.families[2] == "long_docs:0.5"
        with pytest.raises(StrataInputError, match="takes no classes"):
            config_from_dict({"objective": "custom", "families": ["cluster", "long_docs:0.5:4"]})
        f, seg, cluster, length = _parity_instance()
        chars = Objective.named("custom", families=["cluster", "long_docs"]).matrix(f)
        lo, hi = chars.family_columns["long_docs"]
        totals = f.bins.column_totals()
        top = np.arange(totals.size) >= (3 * totals.size) // 4
        assert hi - lo == 2 and np.array_equal(chars.column_totals()[lo:hi], [totals[~top].sum(), totals[top].sum()])
        schedule = D.prepare(seg, f.sequence_ids, cluster, length, length_bins=8)
        assert any(m == "batch_dev_long_docs_max" for _, m, _, _ in D.batch_rows("x", schedule, (8,)))
    finally:
        monkeypatch.delenv("STRATA_PLUGINS")
        FAMILIES.reload()
    assert "long_docs" not in FAMILIES.names()


def _page_block(heading: str) -> str:
    """The first python block under ``## <heading>`` of docs/architecture.md."""
    import re

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    found = re.search(rf"## {re.escape(heading)}\n.*?```python\n(.*?)```", page, flags=re.S)
    assert found, f"docs/architecture.md has no python block under {heading!r}"
    return found.group(1)


def test_the_architecture_pages_export_format_example_runs(tmp_path, monkeypatch, capsys):
    """docs/architecture.md's example format, as written there, is one file that the config and
    ``strata export`` take; its array, read back with ``np.load``, holds the ordering's sequences
    position for position, as the built-in ``numpy`` export does."""
    import numpy as np
    from export_root import build_root, write_ordering

    from assets.cli import build_parser, main
    from pipeline.export.numpy_tokens import open_numpy

    (tmp_path / "npy.py").write_text(_page_block("Worked example: adding an export format"))
    monkeypatch.setenv("STRATA_PLUGINS", str(tmp_path / "npy.py"))
    FORMATS.reload()
    try:
        assert config_from_dict({"export": {"formats": ["numpy", "npy"]}}).export.formats == ["numpy", "npy"]
        sub = next(a for a in build_parser()._actions if a.dest == "command").choices
        assert "npy" in next(a for a in sub["export"]._actions if a.dest == "format").choices
        _, _, store = build_root(tmp_path / "root", seq_len=32)
        order = np.random.default_rng(5).permutation(store.n_sequences)
        write_ordering(tmp_path / "root", "greedy", order)
        (tmp_path / "cfg.yaml").write_text("seq_len: 32\nbatch_size: 4\n")
        base = ["export", "--data-root", str(tmp_path / "root"), "--config", str(tmp_path / "cfg.yaml"), "--strategy", "greedy"]
        assert main([*base, "--format", "npy", "--out", str(tmp_path / "npy")]) == 0, capsys.readouterr().err
        assert main([*base, "--format", "numpy", "--out", str(tmp_path / "numpy")]) == 0, capsys.readouterr().err
        got = np.load(tmp_path / "npy" / "tokens.npy", mmap_mode="r")
        meta = json.loads((tmp_path / "npy" / "meta.json").read_text())
        assert got.shape == (order.size, 32) and meta["format"] == "npy" and meta["strategy"] == "greedy" and meta["global_batch"] == 4
        np.testing.assert_array_equal(got, store.batch(order)[0])  # position p holds the ordering's p-th sequence
        np.testing.assert_array_equal(got, open_numpy(tmp_path / "numpy")[0])
        assert (tmp_path / "npy" / ".strata-export").is_file() and not (tmp_path / "npy" / "tokens.bin").exists()
    finally:
        monkeypatch.delenv("STRATA_PLUGINS")
        FORMATS.reload()
    assert "npy" not in FORMATS.names()


def test_the_architecture_pages_sampler_example_runs(tmp_path, monkeypatch):
    """docs/architecture.md's example training-time sampler, as written there, is one file: the
    config takes it and ``train_run`` on a small data root draws every batch through it, the
    first from its uniform start, the later ones weighted by the losses training fed back."""
    import duckdb
    import numpy as np
    import polars as pl
    from export_root import build_root, write_ordering

    from pipeline.ordering.strategies import scheduled, training_time
    from pipeline.storage.layout import Layout
    from pipeline.training.stage import TrainRunParams, train_run

    (tmp_path / "loss_priority.py").write_text(_page_block("Worked example: adding a training-time sampler"))
    monkeypatch.setenv("STRATA_PLUGINS", str(tmp_path / "loss_priority.py"))
    STRATEGIES.reload()
    try:
        steps, batch, seed = 4, 4, 3
        cfg = config_from_dict({"strategies": ["random", "loss_priority"], "seq_len": 32, "batch_size": batch, "max_steps": steps,
                                "warmup_steps": 1, "checkpoint_every": 2, "probe_batches": 1, "probe_fractions": [1.0],
                                "attention": "dense"})
        assert "loss_priority" in training_time() and "loss_priority" not in scheduled()
        _, segments, store = build_root(tmp_path / "root", seq_len=32)
        write_ordering(tmp_path / "root", "loss_priority", np.arange(store.n_sequences))  # as orderings writes original's order
        layout = Layout(tmp_path / "root")
        result = train_run(layout, TrainRunParams.from_config(cfg), "loss_priority", seed,
                           lambda: duckdb.connect(str(tmp_path / "w.duckdb")), {}, log=lambda _: None)
        assert result.rows["steps"] == steps
        served = pl.read_parquet(layout.run_dir("loss_priority", seed) / "stream.parquet").sort("position")["sequence_id"].to_numpy()
        assert served.shape == (steps * batch,) and all(np.unique(b).size == batch for b in served.reshape(steps, batch))
        rng, m = np.random.default_rng(seed), store.n_sequences
        uniform = np.concatenate([rng.choice(m, size=batch, replace=False, p=np.ones(m) / m) for _ in range(steps)])
        assert np.array_equal(served[:batch], uniform[:batch])  # nothing seen yet: every sequence weighs the same
        assert not np.array_equal(served, uniform)  # after it, the fed-back losses weigh the draws
        with duckdb.connect(str(tmp_path / "w.duckdb")) as con:
            assert con.execute("SELECT count(*) FROM train_log WHERE strategy = 'loss_priority'").fetchone()[0] == steps
        assert not (layout.run_dir("loss_priority", seed) / "ckpt.pt").exists()
    finally:
        monkeypatch.delenv("STRATA_PLUGINS")
        STRATEGIES.reload()
    assert "loss_priority" not in STRATEGIES.names()

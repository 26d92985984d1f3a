"""``greedy_blend`` (pipeline/ordering/blend.py): the demo corpus's domains as named sources with
weights by stage, realized by repetition / subsampling and ordered by the greedy; every use of
every document counted; bad blends stop with the key and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from helpers import demo_domains, stage_shares

from pipeline.config import StrataConfig
from pipeline.errors import StrataInputError
from pipeline.ordering.blend import Blend, blend_accounting, document_uses, group_tokens, planned_counts, stage_l1
from pipeline.ordering.engine import OrderParams, run_strategy
from pipeline.ordering.features import packed_sequence_features
from pipeline.ordering.parts import PART_BYTES_PER_SEQUENCE
from pipeline.packing.pack import pack_concat

L = 256
TOLERANCE = 0.05  # L1 distance of each stage's realized source shares from its weights (docs/mixture.md, "Blends")
SOURCES = ["code", "religious_text", "web"]  # sorted: the groups' order
STAGES = [{"until_tokens": 0.7, "weights": {"web": 0.5, "code": 0.3, "religious_text": 0.2}},
          {"weights": {"web": 0.2, "code": 0.2, "religious_text": 0.6}}]  # the anneal: religious_text in the last 30%
CAPS = {"code": 1, "religious_text": 2, "web": 1}  # each source's cap on a piece's uses under max_repetition {religious_text: 2}


@pytest.fixture(scope="module")
def corpus():
    """200 demo documents of three domains (their domain as ``source``), about a third of the
    tokens each, packed in a random order (sequences mix sources) into 256-token sequences."""
    recs = demo_domains(("web", "code", "religious_text"), 120)
    pick = ([r for r in recs if r["domain"] == "web"] + [r for r in recs if r["domain"] == "code"][:30]
            + [r for r in recs if r["domain"] == "religious_text"][:50])
    n = len(pick)
    ntok = np.array([max(1, len(r["text"].split())) for r in pick]) + 1
    docs = pl.DataFrame({"doc_id": np.arange(n), "cluster": np.arange(n) % 4, "n_tokens": ntok,
                         "source": [r["domain"] for r in pick], "score": np.random.default_rng(1).random(n)})
    seg = pack_concat(np.random.default_rng(0).permutation(n), ntok, L).segments
    return docs, seg


def params(**mixture) -> OrderParams:
    return OrderParams.from_config(StrataConfig(length_bins=8, mixture=mixture))


def group_matrix(docs: pl.DataFrame, seg: pl.DataFrame, column: str = "source") -> np.ndarray:
    """(sequences x sources) tokens, computed here from the segments."""
    names = sorted(set(docs[column].to_list()))
    src = docs[column].to_numpy()[seg["doc_id"].to_numpy()]
    g = np.zeros((int(seg["sequence_id"].max()) + 1, len(names)))
    np.add.at(g, (seg["sequence_id"].to_numpy(), np.searchsorted(names, src)), seg["n_tokens"].to_numpy())
    return g


def test_demo_domains_as_sources_per_stage(corpus):
    docs, seg = corpus
    p = params(stages=STAGES, max_repetition={"religious_text": 2.0})
    order = run_strategy("greedy_blend", docs, seg, L, p, seed=0).order["sequence_id"].to_numpy()
    g = group_matrix(docs, seg)
    got = stage_shares(order, g, [0.7, 1.0])
    want = np.array([[STAGES[k]["weights"][s] for s in SOURCES] for k in range(2)])
    l1 = np.abs(got - want).sum(axis=1)
    assert l1.max() <= TOLERANCE, (got, l1)
    # the shares differ from the corpus's and from a shuffle of the same schedule: the greedy did it
    shuffled = stage_shares(np.random.default_rng(0).permutation(order), g, [0.7, 1.0])
    assert np.abs(shuffled - want).sum(axis=1).max() > 2 * TOLERANCE
    # caps: religious_text used at most twice its tokens, the others at most once; no sequence beyond 2 copies
    copies = np.bincount(order, minlength=g.shape[0])
    used = (g * copies[:, None]).sum(axis=0) / g.sum(axis=0)
    assert used[SOURCES.index("religious_text")] <= 2.0 + 0.05 and copies.max() <= 2
    assert used[SOURCES.index("web")] <= 1.0 + 1e-9 and used[SOURCES.index("code")] <= 1.0 + 1e-9
    # caps per document piece: only a sequence all of whose pieces are religious_text's (cap 2) may be used twice
    pure = g[:, SOURCES.index("religious_text")] == g.sum(axis=1)
    assert (copies[~pure] <= 1).all()


def test_every_use_is_counted(corpus):
    """The accounting rows: each document piece's planned uses (the solver's copies) equal its
    realized uses in the order, and the per-stage table measures the order."""
    docs, seg = corpus
    p = params(stages=STAGES, max_repetition={"religious_text": 2.0})
    order = run_strategy("greedy_blend", docs, seg, L, p, seed=3).order["sequence_id"].to_numpy()
    codes = np.searchsorted(SOURCES, docs["source"].to_numpy())
    sid, did = seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy()
    f = packed_sequence_features(sid, did, seg["n_tokens"].to_numpy(), docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy(), 8, {})
    groups = group_tokens(np.searchsorted(f.sequence_ids, sid), codes[did], seg["n_tokens"].to_numpy().astype(float), f.n_sequences, 3)
    planned, weights, _ = planned_counts(f, groups, p.blend, SOURCES, float(f.lengths.sum()), p.max_sequence_copies, 3)
    uses = document_uses(seg, dict(zip(range(docs.height), docs["source"].to_list())), planned, order,
                         CAPS)
    assert uses.height == seg.height and (uses["planned_uses"] == uses["realized_uses"]).all()
    assert int((uses["n_tokens"] * uses["realized_uses"]).sum()) == int(group_matrix(docs, seg)[order].sum())
    assert (uses["realized_uses"] <= uses["cap"]).all() and (uses["realized_uses"] == 0).any()  # within caps, left out counted
    g = group_matrix(docs, seg)
    table = blend_accounting(order, g, weights, p.blend.ends, SOURCES, np.array([1.0, 2.0, 1.0]), np.ones(3))
    got = stage_shares(order, g, [0.7, 1.0])
    for k in range(2):
        np.testing.assert_allclose(table.filter(pl.col("stage") == k).sort("group")["realized_share"].to_numpy(), got[k])
    assert max(stage_l1(table).values()) <= TOLERANCE


def test_one_stage_max_fraction_and_a_binned_column(corpus):
    docs, seg = corpus
    p = params(weights={"web": 1, "code": 1, "religious_text": 1}, max_fraction={"code": 0.5})
    order = run_strategy("greedy_blend", docs, seg, L, p, seed=0).order["sequence_id"].to_numpy()
    g = group_matrix(docs, seg)
    distinct = g[np.unique(order)].sum(axis=0) / g.sum(axis=0)
    assert distinct[SOURCES.index("code")] <= 0.5 + 1e-9  # a subsample: at most half of code's distinct tokens
    assert np.abs(stage_shares(order, g, [1.0])[0] - 1 / 3).sum() <= TOLERANCE
    # a numeric column in 2 token quantiles, the top one annealed in the last half
    q = params(column="score", bins=2, stages=[{"until_tokens": 0.5, "weights": {0: 0.8, 1: 0.2}}, {"weights": {0: 0.2, 1: 0.8}}],
               max_repetition={0: 2, 1: 2})
    order = run_strategy("greedy_blend", docs, seg, L, q, seed=0).order["sequence_id"].to_numpy()
    binned = docs.with_columns(score=(pl.col("score") > docs.sort("score").with_columns(c=pl.col("n_tokens").cum_sum())
                                      .filter(pl.col("c") >= pl.col("n_tokens").sum() / 2)["score"][0]).cast(pl.Int64))
    got = stage_shares(order, group_matrix(binned, seg, "score"), [0.5, 1.0])
    assert got[0][0] > 0.6 and got[1][1] > 0.6, got  # random packing mixes the bins inside sequences: the direction holds


def test_bad_blends_name_the_key(corpus, tmp_path):
    docs, seg = corpus
    with pytest.raises(StrataInputError) as err:
        run_strategy("greedy_blend", docs, seg, L, params(weights={"wbe": 1.0}), seed=0)
    assert "mixture.weights" in str(err.value) and "web" in err.value.fix
    with pytest.raises(StrataInputError) as err:
        run_strategy("greedy_blend", docs, seg, L, params(column="domain", weights={"web": 1.0}), seed=0)
    assert "mixture.column" in err.value.fix and "source" in err.value.fix
    with pytest.raises(StrataInputError) as err:
        run_strategy("greedy_blend", docs, seg, L, OrderParams(), seed=0)
    assert "mixture.weights" in err.value.fix and "--" not in err.value.fix
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(repo)}
    for text, key in [
        ("mixture:\n  stages:\n    - {until_tokens: 0.5, weights: {web: 1}}\n    - {until_tokens: 0.4, weights: {code: 1}}\n",
         "mixture.stages"),
        ("mixture:\n  weights: {web: 1}\n  stages:\n    - {weights: {code: 1}}\n", "mixture.weights"),
        ("mixture:\n  weights: {web: -1, code: 1}\n", "mixture.weights"),
        ("mixture:\n  weights: {web: 1}\n  max_repetition: {web: 0.5}\n", "mixture.max_repetition"),
        ("mixture:\n  stages:\n    - {until_tokens: 0.5, weigths: {web: 1}}\n", "weigths"),
        # a source the corpus lacks: stopped once the corpus is read, before the tokenizer and the embeddings
        ("strategies: [random, greedy_blend]\nmixture:\n  weights: {wbe: 1}\n", "mixture.weights names the group 'wbe'"),
    ]:
        (tmp_path / "bad.yaml").write_text(f"data_root: {tmp_path / 'root'}\n{text}")
        proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(tmp_path / "bad.yaml")],
                              capture_output=True, text=True, env=env, cwd=repo, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert key in proc.stderr and "Fix:" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert not (tmp_path / "root" / "tokens").exists() and not list((tmp_path / "root").glob("**/embeddings*"))


def test_default_config_has_no_blend():
    """Without mixture.weights or mixture.stages nothing changes: no blend, no new lineage key."""
    p = OrderParams.from_config(StrataConfig())
    assert p.blend is None and "blend" not in p.recorded()
    assert Blend.from_config(StrataConfig(mixture={"weights": {"web": 1}}).mixture).ends == (1.0,)


@pytest.mark.integration
def test_strata_run_realizes_the_blend_and_counts_every_use(tmp_path):
    """``strata run`` to the orderings with ``mixture.stages`` over the demo domains as sources,
    ordered in parts of at most 2,000 sequences (each a worker process of its own, the parts' plans
    checked by the accounting): the blend's accounting files and DuckDB rows, the checks, and
    ``strata export`` of the schedule."""
    import json

    import duckdb
    import yaml

    from pipeline.storage.layout import Layout, Store

    repo = Path(__file__).resolve().parents[1]
    recs = demo_domains(("web", "code", "religious_text"), 40)
    recs = [r for r in recs if r["domain"] != "code"] + [r for r in recs if r["domain"] == "code"][:12]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(tmp_path / "corpus.jsonl"), "source_field": "domain"},
           "heldout_fraction": 0.0, "vocab_size": 300, "k": 3, "seq_len": 64, "length_bins": 4, "batch_size": 4,
           "embed_method": "shallow", "embed_max_tokens": 32, "strategies": ["random", "greedy_blend"], "stationarity_shuffles": 5,
           "mixture_tolerance": 0.1, "order_part_bytes": 2000 * PART_BYTES_PER_SEQUENCE,
           "mixture": {"stages": [{"until_tokens": 0.7, "weights": {"web": 0.5, "code": 0.3, "religious_text": 0.2}},
                                  {"weights": {"web": 0.2, "code": 0.2, "religious_text": 0.6}}],
                       "max_repetition": {"religious_text": 2}}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(repo)}
    cli = [sys.executable, "-m", "assets.cli"]
    proc = subprocess.run([*cli, "run", "--config", str(tmp_path / "cfg.yaml"), "--select", "*orderings"],
                          capture_output=True, text=True, env=env, cwd=repo, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    layout = Layout(tmp_path / "root")
    ordering = Store(layout).ordering("greedy_blend")
    stages = pl.read_parquet(layout.inside("orderings", "greedy_blend.blend.parquet"))
    uses = pl.read_parquet(layout.inside("orderings", "greedy_blend.uses.parquet"))
    assert (uses["planned_uses"] == uses["realized_uses"]).all() and uses["realized_uses"].sum() >= ordering.order.size
    with np.load(layout.inside("orderings", "greedy_blend.parts_plan.npz")) as plan:  # the parts' plans, which the accounting read
        assert plan["asked"].size >= 2 and int(plan["copies"].sum()) == ordering.order.size
    assert max(stage_l1(stages).values()) <= 0.1, stages  # mixture_tolerance of this small corpus
    con = duckdb.connect(str(layout.duckdb), read_only=True)
    rows = con.sql("SELECT * FROM blend_document_uses WHERE strategy = 'greedy_blend'").pl()
    assert rows.height == uses.height and rows["realized_uses"].sum() == uses["realized_uses"].sum()
    checks = con.sql("SELECT * FROM blend_stages WHERE strategy = 'greedy_blend'").pl()
    assert checks.height == stages.height
    budget = con.sql("SELECT * FROM blend_budget WHERE strategy = 'greedy_blend'").pl()
    con.close()
    # the caps cut the schedule (the whole corpus asked at other shares than its own): recorded, and printed at the run's end
    assert budget.height == 1 and budget["binding_group"][0] in SOURCES, budget
    assert budget["scheduled_tokens"][0] == int(stages.filter(pl.col("stage") == 0)["scheduled_tokens"].sum())
    assert budget["scheduled_tokens"][0] < budget["asked_tokens"][0] == budget["corpus_tokens"][0]
    warned = [ln for ln in proc.stdout.splitlines() if ln.startswith("warning: orderings[greedy_blend] schedule_meets_budget")]
    assert warned and f"{budget['binding_group'][0]!r} binds" in warned[0] and "of the corpus" in warned[0], proc.stdout[-3000:]
    out = tmp_path / "export"
    exp = subprocess.run([*cli, "export", "--data-root", str(layout.root), "--config", str(tmp_path / "cfg.yaml"),
                          "--strategy", "greedy_blend", "--format", "numpy", "--out", str(out)],
                         capture_output=True, text=True, env=env, cwd=repo, timeout=600)
    assert exp.returncode == 0, exp.stdout[-2000:] + exp.stderr[-3000:]
    assert json.loads((out / "meta.json").read_text())["n_sequences"] == ordering.order.size


NEW_STAGES = [{"until_tokens": 0.6, "weights": {"web": 0.5, "code": 0.3, "religious_text": 0.2}},
              {"weights": {"web": 0.2, "code": 0.0, "religious_text": 0.8}}]  # a stage appended: no more code from 60%


def test_new_stage_after_a_frozen_prefix(corpus):
    """The mix changed mid-run: the consumed prefix of the old one-stage blend stays, the rest
    follows the new stages counted from the prefix's end, and every use is planned, within caps."""
    from pipeline.ordering.blend import FrozenPlan, document_plan, frozen_document_uses, planned_after

    docs, seg = corpus
    old = params(weights=STAGES[0]["weights"], max_repetition={"religious_text": 2.0})
    first = run_strategy("greedy_blend", docs, seg, L, old, seed=0).order["sequence_id"].to_numpy()
    n_prefix = first.size // 3
    new = params(stages=NEW_STAGES, max_repetition={"religious_text": 2.0})
    order = run_strategy("greedy_blend", docs, seg, L, new, seed=0, prefix=first[:n_prefix]).order["sequence_id"].to_numpy()
    assert np.array_equal(order[:n_prefix], first[:n_prefix])  # the consumed steps, unchanged
    g = group_matrix(docs, seg)
    tok = g[order]
    start = np.r_[0, np.cumsum(tok.sum(axis=1))[:-1]]
    total = tok.sum()
    for k, (lo, hi) in enumerate([(start[n_prefix], 0.6 * total), (0.6 * total, total)]):  # after the prefix, by stage
        got = tok[(start >= lo) & (start < hi) & (np.arange(order.size) >= n_prefix)].sum(axis=0)
        want = np.array([NEW_STAGES[k]["weights"][s] for s in SOURCES])
        assert np.abs(got / got.sum() - want).sum() <= TOLERANCE, (k, got / got.sum())
    # the plan, solved again: prefix uses + planned uses after it = every sequence's occurrences, within its cap
    codes = np.searchsorted(SOURCES, docs["source"].to_numpy())
    sid, did = seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy()
    f = packed_sequence_features(sid, did, seg["n_tokens"].to_numpy(), docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy(), 8, {})
    groups = group_tokens(np.searchsorted(f.sequence_ids, sid), codes[did], seg["n_tokens"].to_numpy().astype(float), f.n_sequences, 3)
    plan = planned_after(f, groups, new.blend, SOURCES, float(f.lengths.sum()), new.max_sequence_copies, 0,
                         np.searchsorted(f.sequence_ids, first[:n_prefix]))
    realized = np.bincount(order, minlength=f.n_sequences)[f.sequence_ids]
    assert np.array_equal(plan.prefix + plan.suffix, realized) and (realized <= plan.cap).all()
    assert plan.prefix.sum() == n_prefix and realized.max() == 2  # religious_text repeated for the new stage, within its cap
    doc_group = dict(zip(range(docs.height), docs["source"].to_list()))
    uses = frozen_document_uses(seg, doc_group, plan, f.sequence_ids, order, n_prefix, CAPS)
    assert (uses["planned_uses"] == uses["prefix_planned"] + uses["suffix_planned"]).all()
    assert (uses["planned_uses"] == uses["realized_uses"]).all() and (uses["realized_uses"] <= uses["cap"]).all()
    assert (uses["prefix_realized"] == uses["prefix_planned"]).all() and uses["prefix_realized"].sum() > 0
    # a hand-corrupted order (one position after the prefix names another sequence) breaks the equality
    bad = order.copy()
    bad[-1] = next(s for s in f.sequence_ids if s != order[-1])
    broken = frozen_document_uses(seg, doc_group, plan, f.sequence_ids, bad, n_prefix, CAPS)
    assert (broken["planned_uses"] != broken["realized_uses"]).sum() >= 2
    # the documents the old plan used and the new one does not: reported as dropped (code among them: no more from 60%)
    keys = pl.DataFrame({"doc_id": np.arange(docs.height), "id": [f"d{i}" for i in range(docs.height)], "content_hash": "h"})
    before = frozen_document_uses(seg, doc_group, FrozenPlan(np.zeros(f.n_sequences, np.int64), np.bincount(first, minlength=f.n_sequences)
                                                             [f.sequence_ids], plan.cap, plan.weights, 0.0), f.sequence_ids, first, 0, CAPS)
    previous = document_plan(before, keys, None)
    table = document_plan(uses, keys, previous)
    dropped = table.filter(pl.col("status") == "dropped")
    assert "code" in set(dropped["group"]) and "religious_text" not in set(dropped["group"]), dropped
    assert (dropped["previous_planned_token_uses"] > 0).all() and (dropped["realized_token_uses"] == 0).all()
    assert document_plan(uses, keys, table).equals(table)  # the same plan again keeps reporting the drop


@pytest.mark.integration
def test_strata_run_changes_the_mix_after_a_frozen_prefix(tmp_path):
    """``strata run --freeze-prefix P`` with one blend, then with a stage appended: the prefix's
    positions stay, DuckDB holds every piece's prefix / suffix uses and every document's plan
    against the replaced one, and the uses check passes on the order and fails on a corrupted one."""
    import json

    import duckdb
    import yaml

    from pipeline.config import load_config
    from pipeline.ordering.stage import OrderStageParams, order_params
    from pipeline.ordering.strategies.greedy_blend import USES_CHECK, accounting
    from pipeline.represent.embeddings import default_model_path
    from pipeline.storage.layout import Layout, Store

    repo = Path(__file__).resolve().parents[1]
    recs = demo_domains(("web", "code", "religious_text"), 40)
    recs = [r for r in recs if r["domain"] != "code"] + [r for r in recs if r["domain"] == "code"][:12]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(tmp_path / "corpus.jsonl"), "source_field": "domain"},
           "heldout_fraction": 0.0, "tokenizer": default_model_path(), "k": 3, "seq_len": 64, "length_bins": 4, "batch_size": 4,
           "embed_method": "shallow", "embed_max_tokens": 32, "strategies": ["greedy_blend"], "mixture_tolerance": 0.1,
           "mixture": {"weights": NEW_STAGES[0]["weights"], "max_repetition": {"religious_text": 2}}}
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(repo)}
    layout, n_prefix = Layout(tmp_path / "root"), 40

    def run() -> str:
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
        proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(tmp_path / "cfg.yaml"), "--select",
                               "*orderings", "--freeze-prefix", str(n_prefix)],
                              capture_output=True, text=True, env=env, cwd=repo, timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return proc.stdout

    run()
    first = Store(layout).ordering("greedy_blend").order.copy()
    stages = [NEW_STAGES[0], {"weights": {"web": 0.6, "code": 0.4}}]  # the mix edited mid-run: no more religious_text from 60%
    cfg["mixture"] = {"stages": stages, "max_repetition": {"religious_text": 2}}
    cfg["mixture_tolerance"] = 1e-4  # no stage of a small corpus is that close: the run says so at its end
    out = run()
    missed = [ln for ln in out.splitlines() if ln.startswith("warning: orderings[greedy_blend] schedule_realizes_mixture")]
    assert missed and "> 0.0001 from the blend" in missed[0], out[-3000:]
    order = Store(layout).ordering("greedy_blend").order
    assert np.array_equal(order[:n_prefix], first[:n_prefix]) and not np.array_equal(order, first)
    con = duckdb.connect(str(layout.duckdb), read_only=True)
    uses = con.sql("SELECT * FROM blend_document_uses WHERE strategy = 'greedy_blend'").pl()
    plan = con.sql("SELECT * FROM blend_document_plan WHERE strategy = 'greedy_blend'").pl()
    con.close()
    assert (uses["planned_uses"] == uses["prefix_planned"] + uses["suffix_planned"]).all()
    assert (uses["realized_uses"] == uses["prefix_realized"] + uses["suffix_realized"]).all()
    assert (uses["planned_uses"] == uses["realized_uses"]).all() and (uses["realized_uses"] <= uses["cap"]).all()
    by_seq = uses.group_by("sequence_id").agg(pl.col("prefix_realized").first())
    assert by_seq["prefix_realized"].sum() == n_prefix  # every consumed position counted once
    assert plan["previous_planned_token_uses"].null_count() == 0  # every document against the plan it replaced
    assert (plan.filter(pl.col("status") == "dropped")["planned_token_uses"] == 0).all()
    assert plan.filter(pl.col("status") == "dropped").height > 0 and plan["realized_token_uses"].sum() > 0
    params = order_params(OrderStageParams.from_config(load_config(layout.root / "run_config.yaml")), layout)

    def uses_check():
        return next(c for c in accounting(layout, params, "greedy_blend", 0.1, 0)[1] if c.name == USES_CHECK)

    assert uses_check().passed
    path = layout.ordering("greedy_blend")
    written = pl.read_parquet(path)
    ids = written["sequence_id"].to_numpy().copy()
    ids[-1] = next(s for s in np.unique(ids) if s != ids[-1])  # one position after the prefix names another sequence
    written.with_columns(sequence_id=pl.Series(ids)).write_parquet(path)
    failed = uses_check()
    assert not failed.passed and "used other than planned" in failed.description, failed.description
    ids[0] = ids[1] if ids[1] != ids[0] else ids[2]  # and the prefix itself edited
    written.with_columns(sequence_id=pl.Series(ids)).write_parquet(path)
    assert "does not start with its frozen prefix" in uses_check().description


def test_freeze_prefix_accepts_greedy_blend_only_among_schedules():
    from pipeline.config import config_from_dict

    blend = {"weights": {"web": 1.0}}
    assert config_from_dict({"freeze_prefix": 8, "strategies": ["greedy_blend"], "tokenizer": "gpt2", "mixture": blend}).freeze_prefix == 8
    with pytest.raises(StrataInputError) as err:
        config_from_dict({"freeze_prefix": 8, "strategies": ["greedy_mixture"], "tokenizer": "gpt2"})
    assert "greedy_mixture" in str(err.value)


def _features(docs: pl.DataFrame, seg: pl.DataFrame, column: str = "source"):
    """(features, group tokens, group names) of a packing, the groups computed here."""
    names = sorted(set(docs[column].cast(pl.String).to_list()))
    codes = np.searchsorted(names, docs[column].cast(pl.String).to_numpy())
    sid, did = seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy()
    f = packed_sequence_features(sid, did, seg["n_tokens"].to_numpy(), docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy(), 8, {})
    groups = group_tokens(np.searchsorted(f.sequence_ids, sid), codes[did], seg["n_tokens"].to_numpy().astype(float), f.n_sequences,
                          len(names))
    return f, groups, names


def _largest_schedule(f, groups, share: np.ndarray, row_cap: np.ndarray, group_cap: np.ndarray) -> float:
    """The most tokens T with copies 0 <= r_s <= row_cap_s whose group tokens are share x T and at
    most group_cap: a linear program solved by scipy's HiGHS (the reference, independent of the solver)."""
    from scipy import sparse as sp
    from scipy.optimize import linprog

    c = sp.csr_matrix((groups.data, groups.indices, groups.indptr), shape=(groups.n_rows, groups.n_cols))
    a_eq = sp.hstack([c.T, -share[:, None]]).tocsr()
    a_ub = sp.hstack([c.T, sp.csr_matrix((groups.n_cols, 1))]).tocsr()
    res = linprog(np.r_[np.zeros(f.n_sequences), -1.0], A_eq=a_eq, b_eq=np.zeros(groups.n_cols), A_ub=a_ub, b_ub=group_cap,
                  bounds=[(0, float(r)) for r in row_cap] + [(0, None)], method="highs")
    assert res.status == 0, res.message
    return -float(res.fun)


def test_an_infeasible_blend_schedules_what_the_caps_allow(corpus):
    """A source of ~1.5% of the tokens asked for 10% under max_repetition 2: the schedule is the
    largest the caps allow (the linear program's optimum) to within one sequence, not a sqrt(2)
    step below it; the binding source is named; mixture.on_infeasible: error stops with it."""
    from pipeline.ordering.blend import row_caps

    docs, seg = corpus
    small = docs.filter((pl.col("source") != "code") | (pl.col("doc_id") < docs.filter(pl.col("source") == "code")["doc_id"].min() + 4))
    seg = pack_concat(np.random.default_rng(0).permutation(small["doc_id"].to_numpy()), docs["n_tokens"].to_numpy(), L).segments
    f, groups, names = _features(docs, seg)
    blend = {"weights": {"web": 0.6, "code": 0.1, "religious_text": 0.3}, "max_repetition": {"code": 2.0}}
    p = params(**blend)
    counts, w, fit = planned_counts(f, groups, p.blend, names, float(f.lengths.sum()), p.max_sequence_copies, 0)
    max_rep = p.blend.caps(names, "max_repetition", 1.0)
    cap = np.minimum(row_caps(f, groups, max_rep, np.ones(3), p.max_sequence_copies, 0), p.max_sequence_copies)
    best = _largest_schedule(f, groups, w[0], cap, max_rep * groups.column_totals())
    scheduled = float(counts @ f.lengths)
    assert fit.binding == "code" and fit.asked == float(f.lengths.sum()) > 3 * best
    assert best - L <= scheduled <= best + L, (scheduled, best, fit)  # within one sequence of the optimum
    assert best - L <= fit.allowed <= best + 1e-6 * best
    assert "code" in fit.warning(p.blend) and f"{fit.allowed / fit.corpus:.1%}" in fit.warning(p.blend)
    order = run_strategy("greedy_blend", docs, seg, L, p, seed=0).order["sequence_id"].to_numpy()
    assert float(f.lengths[np.searchsorted(f.sequence_ids, order)].sum()) == scheduled  # the order is that schedule
    with pytest.raises(StrataInputError) as err:
        run_strategy("greedy_blend", docs, seg, L, params(**blend, on_infeasible="error"), seed=0)
    assert "'code' binds" in str(err.value) and "mixture_budget_tokens" in err.value.fix
    # a budget the caps allow: no cut, no error, and the schedule holds it within one sequence
    ok = params(**blend, on_infeasible="error")
    ok = OrderParams(**{**ok.__dict__, "mixture_budget_tokens": int(best * 0.8)})
    counts, _, fit = planned_counts(f, groups, ok.blend, names, float(ok.mixture_budget_tokens), ok.max_sequence_copies, 0)
    assert fit.binding == "" and abs(float(counts @ f.lengths) - best * 0.8) <= L


def test_caps_hold_per_document_piece(corpus):
    """A source allowed 2 uses, asked for most of the tokens, in sequences that mix sources: no
    piece of a source capped at 1 is used twice because a piece of the repeated source dominates
    its sequence (each piece's uses counted here from the segments and the order); the pure
    sequences of the repeated source are what gets repeated, and the uses table flags a piece
    used beyond its own cap."""
    docs, seg = corpus
    # half of religious_text's documents packed on their own (pure sequences), the rest of the corpus mixed in random order
    rel = docs.filter(pl.col("source") == "religious_text")["doc_id"].to_numpy()
    rest = np.setdiff1d(docs["doc_id"].to_numpy(), rel[: rel.size // 2])
    seg = pack_concat(np.r_[rel[: rel.size // 2], np.random.default_rng(0).permutation(rest)], docs["n_tokens"].to_numpy(), L).segments
    p = params(weights={"religious_text": 0.7, "web": 0.2, "code": 0.1}, max_repetition={"religious_text": 2.0})
    order = run_strategy("greedy_blend", docs, seg, L, p, seed=0).order["sequence_id"].to_numpy()
    copies = np.bincount(order, minlength=int(seg["sequence_id"].max()) + 1)
    src = docs["source"].to_numpy()[seg["doc_id"].to_numpy()]
    uses = copies[seg["sequence_id"].to_numpy()]
    own_cap = np.where(src == "religious_text", 2, 1)
    assert (uses <= own_cap).all(), seg.filter(pl.Series(uses > own_cap))  # every piece within its own source's cap
    assert (uses[src == "religious_text"] == 2).any()  # the repeated source was repeated, in its own sequences
    doc_group = dict(zip(docs["doc_id"].to_list(), docs["source"].to_list()))
    table = document_uses(seg, doc_group, np.bincount(order, minlength=copies.size), order, CAPS)
    assert (table["realized_uses"] <= table["cap"]).all() and table["cap"].to_list() == [CAPS[s] for s in src]
    # a mixed sequence holding a religious_text piece and a web piece, used twice: flagged on the web piece, not the other
    sid = seg["sequence_id"].to_numpy()
    both = np.intersect1d(sid[src == "religious_text"], sid[src == "web"])[0]
    bad = np.r_[order, np.full(2 - copies[both], both)]  # now used twice: within religious_text's cap, beyond web's
    flagged = document_uses(seg, doc_group, np.bincount(bad, minlength=copies.size), bad, CAPS)
    flagged = flagged.filter(pl.col("realized_uses") > pl.col("cap"))
    assert flagged.height and set(flagged["group"]) == {"web"} and set(flagged["sequence_id"]) == {both}


FIVE = ["code", "quotes_humor", "religious_text", "technical_docs", "web"]  # sorted: the groups' order
THREE_STAGES = [
    {"until_tokens": 0.5, "weights": {"web": 0.3, "code": 0.1, "religious_text": 0.2, "technical_docs": 0.2, "quotes_humor": 0.2}},
    {"until_tokens": 0.8, "weights": {"web": 0.2, "code": 0.0, "religious_text": 0.4, "technical_docs": 0.2, "quotes_humor": 0.2}},
    {"weights": {"web": 0.1, "code": 0.3, "religious_text": 0.1, "technical_docs": 0.5, "quotes_humor": 0.0}}]
EDITED = [THREE_STAGES[0],  # after a third of the stream: the second stage ends earlier, the last one changed
          {"until_tokens": 0.7, "weights": {"web": 0.5, "code": 0.0, "religious_text": 0.1, "technical_docs": 0.2, "quotes_humor": 0.2}},
          {"weights": {"web": 0.0, "code": 0.2, "religious_text": 0.6, "technical_docs": 0.1, "quotes_humor": 0.1}}]


@pytest.fixture(scope="module")
def five_sources():
    """Five demo domains as sources, code at 2.4% of the tokens (6 documents), packed in a random order into 256-token sequences."""
    recs = demo_domains(tuple(FIVE), 870)
    take = {"web": 200, "code": 6, "religious_text": 60, "technical_docs": 27, "quotes_humor": 870}
    pick = [r for d in FIVE for r in [x for x in recs if x["domain"] == d][: take[d]]]
    ntok = np.array([max(1, len(r["text"].split())) for r in pick]) + 1
    docs = pl.DataFrame({"doc_id": np.arange(len(pick)), "cluster": np.arange(len(pick)) % 4, "n_tokens": ntok,
                         "source": [r["domain"] for r in pick]})
    return docs, pack_concat(np.random.default_rng(0).permutation(len(pick)), ntok, L).segments


def _stage_l1(order: np.ndarray, g: np.ndarray, stages: list[dict], n_prefix: int = 0) -> list[float]:
    """Per stage, the L1 distance of its source shares after the first ``n_prefix`` positions from its weights (computed here)."""
    ends = [s.get("until_tokens", 1.0) for s in stages]
    tok = g[order]
    start = np.r_[0, np.cumsum(tok.sum(axis=1))[:-1]]
    stage = np.minimum(np.searchsorted(np.array(ends) * tok.sum(), start, side="right"), len(ends) - 1)
    out = []
    for k, st in enumerate(stages):
        got = tok[(stage == k) & (np.arange(order.size) >= n_prefix)].sum(axis=0)
        if got.sum():
            out.append(float(np.abs(got / got.sum() - np.array([st["weights"][s] for s in FIVE])).sum()))
    return out


def test_every_stage_on_target_after_a_change(five_sources):
    """Three stages, a third of the stream frozen, the later stages edited: every stage after the
    prefix, the last included, within L1 0.05 of its weights, and the last batches hold the last
    stage's mix (no leftovers drained at the end); without a change, the batch just before a
    stage boundary holds no more than 5% of a source its stage gives weight 0."""
    docs, seg = five_sources
    g = group_matrix(docs, seg)
    cap = {"code": 2.0}
    for seed in (0, 1):
        first = run_strategy("greedy_blend", docs, seg, L, params(stages=THREE_STAGES, max_repetition=cap), seed=seed)
        first = first.order["sequence_id"].to_numpy()
        assert max(_stage_l1(first, g, THREE_STAGES)) <= TOLERANCE
        tok = g[first]
        start = np.r_[0, np.cumsum(tok.sum(axis=1))[:-1]] / tok.sum()
        before = tok[(start < 0.8) & (start >= 0.8 - 16 * L / tok.sum())].sum(axis=0)  # the 16 positions before the second boundary
        assert before[FIVE.index("code")] / before.sum() <= 0.05, before / before.sum()
        n_prefix = first.size // 3
        order = run_strategy("greedy_blend", docs, seg, L, params(stages=EDITED, max_repetition=cap), seed=seed,
                             prefix=first[:n_prefix]).order["sequence_id"].to_numpy()
        assert np.array_equal(order[:n_prefix], first[:n_prefix])
        l1 = _stage_l1(order, g, EDITED, n_prefix)
        assert len(l1) == 3 and max(l1) <= TOLERANCE, l1
        want = np.array([EDITED[2]["weights"][s] for s in FIVE])
        for last in (order[-16:], order[-32:-16]):  # the final two batches of 16: the last stage's mix, not one source
            t = g[last].sum(axis=0)
            assert np.abs(t / t.sum() - want).sum() <= 0.3 and (t / t.sum()).max() <= 0.8, t / t.sum()


def test_blend_names_checked_when_the_corpus_is_known(tmp_path):
    """A group of mixture.weights, a stage or max_repetition that the corpus column lacks stops the
    corpus stage (pipeline.data.blend_names), naming the key and the values there are; weights not
    summing to 1 are normalized with a warning."""
    from pipeline.config import BlendWeightsNormalized, MixtureConfig
    from pipeline.data.blend_names import check_blend_names

    corpus = tmp_path / "corpus.parquet"
    pl.DataFrame({"doc_id": [0, 1, 2], "source": ["web", "code", "web"], "subdomain": ["a", "b", "c"]}).write_parquet(corpus)
    blend = ["random", "greedy_blend"]
    check_blend_names(corpus, MixtureConfig(weights={"web": 0.5, "code": 0.5}, max_repetition={"code": 2}), blend)
    for mixture, key in [({"weights": {"web": 0.5, "cdoe": 0.5}}, "mixture.weights"),
                         ({"stages": [{"until_tokens": 0.5, "weights": {"web": 1}}, {"weights": {"books": 1}}]},
                          "mixture.stages[1].weights"),
                         ({"weights": {"web": 1.0}, "max_repetition": {"Code": 2}}, "mixture.max_repetition"),
                         ({"column": "subdomain", "weights": {"a": 0.5, "web": 0.5}}, "mixture.weights")]:
        with pytest.raises(StrataInputError) as err:
            check_blend_names(corpus, MixtureConfig(**mixture), blend)
        assert err.value.problem.startswith(f"{key} names the group") and "corpus.parquet" in str(err.value), str(err.value)
        assert ("['a', 'b', 'c']" if mixture.get("column") else "['code', 'web']") in err.value.fix
        check_blend_names(corpus, MixtureConfig(**mixture), ["random"])  # no greedy_blend: nothing to check
    check_blend_names(corpus, MixtureConfig(column="n_chars", weights={"x": 1.0}), blend)  # a column Strata computes: the ordering's
    with pytest.warns(BlendWeightsNormalized, match=r"mixture.weights sum to 2, not 1: normalized to \{web: 0.5, code: 0.5\}"):
        StrataConfig(mixture={"weights": {"web": 1.0, "code": 1.0}})
    with pytest.warns(BlendWeightsNormalized, match=r"mixture.stages\[1\].weights sum to 0.5"):
        StrataConfig(mixture={"stages": [{"until_tokens": 0.5, "weights": {"web": 1}}, {"weights": {"web": 0.25, "code": 0.25}}]})


def test_a_group_the_clean_stage_emptied_is_named(tmp_path):
    """Every document of a source removed by the clean stage (as duplicates): the ordering's error
    says so, with the count and the reason, instead of "the column does not hold it"."""
    import json

    from pipeline.ordering.blend_kept import check_groups_kept
    from pipeline.storage.layout import Layout

    layout = Layout(tmp_path)
    for path in (layout.documents, layout.clusters, layout.corpus, layout.sequences_meta):
        path.parent.mkdir(parents=True, exist_ok=True)
    src = ["web", "web", "dup_src", "dup_src", "dup_src", "code"]
    pl.DataFrame({"doc_id": np.arange(6), "n_tokens": np.full(6, 10), "source": src}).write_parquet(layout.documents)
    pl.DataFrame({"doc_id": np.arange(6), "cluster": np.zeros(6, dtype=np.int64)}).write_parquet(layout.clusters)
    layout.sequences_meta.write_text(json.dumps({"seq_len": 16, "cleaned": True}))
    from pipeline.clean.removals import applied_file

    applied_file(layout).parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame({"doc_id": [2, 3, 4, 5], "removed": ["exact", "exact", "near", "contaminated"]}).write_parquet(applied_file(layout))
    blend = Blend.from_config(StrataConfig(mixture={"weights": {"web": 0.5, "dup_src": 0.5}}).mixture)
    with pytest.raises(StrataInputError) as err:
        check_groups_kept(layout, blend)
    assert "removed every document of the group 'dup_src'" in str(err.value) and "3 documents (2 exact, 1 near)" in str(err.value)
    assert "dup_src" in err.value.fix
    check_groups_kept(layout, Blend.from_config(StrataConfig(mixture={"weights": {"web": 1.0}}).mixture))  # web kept: nothing to say
    with pytest.raises(StrataInputError, match="group 'code'"):  # a group named by a cap only
        check_groups_kept(layout, Blend.from_config(StrataConfig(mixture={"weights": {"web": 1.0}, "max_repetition": {"code": 2}}).mixture))


RAMPED = [{"until_tokens": 0.4, "weights": {"web": 0.6, "code": 0.2, "religious_text": 0.2}},
          {"ramp_tokens": 0.4, "weights": {"web": 0.2, "code": 0.2, "religious_text": 0.6}}]  # 0.4 -> 0.8: linear, then held


def test_a_ramp_is_constant_steps_whose_cumulative_targets_are_the_line():
    blend = params(stages=RAMPED, ramp_steps=4).blend
    assert blend.ends == pytest.approx((0.4, 0.5, 0.6, 0.7, 0.8, 1.0)) and blend.origin == (0, 1, 1, 1, 1, 1)
    w = blend.matrix(SOURCES)
    assert w[1:5, SOURCES.index("religious_text")] == pytest.approx([0.25, 0.35, 0.45, 0.55])  # the line at each step's middle
    x = np.linspace(0.4, 0.8, 4001)  # the linear ramp's cumulative religious_text tokens, integrated here
    line = 0.2 + (x - 0.4) / 0.4 * 0.4
    cum = np.r_[0.0, np.cumsum((line[1:] + line[:-1]) / 2 * np.diff(x))]
    steps = np.cumsum(np.diff(np.r_[0.4, blend.ends[1:5]]) * w[1:5, SOURCES.index("religious_text")])
    np.testing.assert_allclose(steps, cum[[1000, 2000, 3000, 4000]], atol=1e-9)  # equal at every step's end
    assert blend.key(3) == "mixture.stages[1].weights"  # a step names the configured stage
    whole = params(stages=[RAMPED[0], {**RAMPED[1], "ramp_tokens": 0.6}], ramp_steps=3).blend
    assert whole.ends[-1] == 1.0 and len(whole.ends) == 4  # a ramp over the whole stage: no held part
    plain = params(stages=STAGES).blend
    assert plain.origin == () and plain.ends == (0.7, 1.0)  # no ramp: the stages as configured


def test_bad_ramps_name_the_stage():
    with pytest.raises(ValueError, match=r"first stage has no earlier weights to ramp from"):
        params(stages=[{**RAMPED[0], "ramp_tokens": 0.1}, RAMPED[1]])
    with pytest.raises(ValueError, match=r"mixture\.stages\[1\]\.ramp_tokens 0\.7 is longer than the stage \(0\.4 to 1\)"):
        params(stages=[RAMPED[0], {**RAMPED[1], "ramp_tokens": 0.7}])


def test_a_ramp_is_realized_step_by_step(corpus):
    docs, seg = corpus
    p = params(stages=RAMPED, ramp_steps=4, max_repetition={"religious_text": 2.0})
    order = run_strategy("greedy_blend", docs, seg, L, p, seed=0).order["sequence_id"].to_numpy()
    g = group_matrix(docs, seg)
    got, want = stage_shares(order, g, list(p.blend.ends)), p.blend.matrix(SOURCES)
    assert np.abs(got - want).sum(axis=1).max() <= TOLERANCE, (got, want)  # every step at its weights
    assert (np.diff(got[:, SOURCES.index("religious_text")]) > 0.04).all(), got  # religious_text rises step by step

"""``corpus.columns``: fields of the user's own corpus records (a quality score computed upstream, a
language tag) carried through to ``documents.parquet``, usable as ``mixture.column`` and as a
characteristic family; a declared field a record lacks, or a name Strata uses, stops with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from helpers import demo_slice

from pipeline.config import CorpusConfig, StrataConfig, config_from_dict
from pipeline.errors import StrataInputError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}


def _records(n: int = 40) -> list[dict]:
    """Demo documents, each with its own ``score`` (a number computed upstream) and ``lang`` (a string)."""
    recs = demo_slice(n)
    return [{**r, "id": f"doc{i}", "score": round((i * 37 % n) / n, 3), "lang": "en" if i % 3 else "de"} for i, r in enumerate(recs)]


def _strata(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "assets.cli", *args], capture_output=True, text=True, env=ENV, cwd=REPO,
                          timeout=timeout)


def _config(tmp_path: Path, corpus: Path, **extra) -> Path:
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(corpus), "source_field": "domain",
                                                          "columns": {"score": "number", "lang": "string"}},
           "heldout_fraction": 0.1, "vocab_size": 300, "seq_len": 64, **extra}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.integration
def test_declared_columns_reach_the_documents_and_the_ordering(tmp_path):
    """``strata run`` to the token store: every training document's ``score`` and ``lang`` in
    ``documents.parquet`` equal its record's; the ordering reads ``score`` as ``mixture.column``
    (2 token quantiles) and as a family (its token quartiles)."""
    from pipeline.ordering.engine import OrderParams, run_strategy
    from pipeline.ordering.families import spec_of
    from pipeline.ordering.stage import ordering_documents
    from pipeline.packing.pack import pack_concat
    from pipeline.storage.layout import Layout

    recs = _records()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in recs))
    proc = _strata("run", "--config", str(_config(tmp_path, corpus)), "--select", "*tokens")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    layout = Layout(tmp_path / "root")
    docs = pl.read_parquet(layout.documents)
    assert docs.schema["score"] == pl.Float64 and docs.schema["lang"] == pl.String
    want = pl.DataFrame({"id": [r["id"] for r in recs], "want_score": [float(r["score"]) for r in recs],
                         "want_lang": [r["lang"] for r in recs]})
    got = docs.join(want, on="id", how="left")
    assert 0 < docs.height < len(recs)  # the held-out documents are not training documents
    assert got["want_score"].null_count() == 0 and (got["score"] == got["want_score"]).all(), got
    assert (got["lang"] == got["want_lang"]).all()

    # the ordering's documents: a clustering and a packing written here over the documents the run wrote
    n = docs.height
    pl.DataFrame({"doc_id": docs["doc_id"], "cluster": (np.arange(n) % 3).astype(np.int64)}).write_parquet(layout.clusters)
    seg = pack_concat(np.arange(n), docs["n_tokens"].to_numpy() + 1, 64).segments
    mixture = {"column": "score", "bins": 2, "stages": [{"until_tokens": 0.5, "weights": {0: 0.8, 1: 0.2}}, {"weights": {0: 0.2, 1: 0.8}}],
               "max_repetition": {0: 2, 1: 2}}
    blend = OrderParams.from_config(StrataConfig(length_bins=4, batch_size=2, mixture=mixture))
    odocs = ordering_documents(layout, blend, "greedy_blend")
    assert odocs["score"].to_list() == docs.sort("doc_id")["score"].to_list()
    order = run_strategy("greedy_blend", odocs, seg, 64, blend, seed=0).order["sequence_id"].to_numpy()
    assert order.size and np.isin(order, seg["sequence_id"].to_numpy()).all()

    family = OrderParams.from_config(StrataConfig(length_bins=4, batch_size=2, objective="custom", families=["cluster", "score"]))
    fdocs = ordering_documents(layout, family, "greedy")
    codes = spec_of("score").codes(fdocs)  # a numeric column: token quartiles, not one group per distinct score
    assert set(codes.tolist()) == {0, 1, 2, 3}
    assert np.all(np.diff(codes[np.argsort(fdocs["score"].to_numpy(), kind="stable")]) >= 0)  # higher score, same or higher quartile
    greedy = run_strategy("greedy", fdocs, seg, 64, family, seed=0).order["sequence_id"].to_numpy()
    assert np.array_equal(np.sort(greedy), np.unique(seg["sequence_id"].to_numpy()))


@pytest.mark.integration
def test_bad_declared_columns_exit_2(tmp_path):
    """A record without the declared field (its file and line), a name Strata uses, and a
    ``mixture.column`` that is no column (the declared ones listed) stop ``strata run`` with exit 2."""
    recs = _records(12)
    del recs[4]["score"]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in recs))
    proc = _strata("run", "--config", str(_config(tmp_path, corpus)), "--select", "*tokens")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{corpus}, line 5" in proc.stderr and "'score'" in proc.stderr and "corpus.columns" in proc.stderr, proc.stderr[-2000:]
    assert "Fix:" in proc.stderr and "Traceback" not in proc.stderr

    cfg = yaml.safe_load(_config(tmp_path, corpus).read_text())
    cfg["corpus"]["columns"] = {"source": "string"}
    (tmp_path / "clash.yaml").write_text(yaml.safe_dump(cfg))
    proc = _strata("run", "--config", str(tmp_path / "clash.yaml"), "--select", "*tokens")
    assert proc.returncode == 2 and "corpus.columns" in proc.stderr and "Strata's own" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "root" / "corpus.parquet").exists()

    recs = _records(12)
    corpus.write_text("".join(json.dumps(r) + "\n" for r in recs))
    path = _config(tmp_path, corpus, strategies=["random", "greedy_blend"],
                   mixture={"column": "scroe", "bins": 2, "weights": {0: 0.5, 1: 0.5}})
    proc = _strata("run", "--config", str(path), "--select", "*tokens")
    assert proc.returncode == 2 and "mixture.column names 'scroe'" in proc.stderr, proc.stderr[-2000:]
    assert "'score'" in proc.stderr and "'lang'" in proc.stderr and "Traceback" not in proc.stderr  # the declared columns offered
    assert not (tmp_path / "root" / "tokens").exists()


def _build(tmp_path: Path, cfg: CorpusConfig, name: str = "out"):
    from pipeline.data.corpus import build_corpus

    out = tmp_path / name
    build = build_corpus(cfg, 0, 0.0, out / "shards", out / "corpus.parquet")
    return build, pl.read_parquet(out / "corpus.parquet")


BASE = [{"id": f"d{i}", "text": f"document {i} text", "score": float(i), "lang": "en"} for i in range(6)]
# (case, what record 3 gets, text of the error): each a value of that record
RECORD_CASES = [("missing", {"score": ...}, "'score' that corpus.columns declares is missing"),
                ("null", {"score": None}, "'score' that corpus.columns declares is null"),
                ("string", {"score": "high"}, "'score' (corpus.columns: number) is 'high', not a finite number"),
                ("nan", {"score": float("nan")}, "'score' (corpus.columns: number) is nan, not a finite number"),
                ("bool", {"score": True}, "is True, not a finite number"),
                ("huge", {"score": 10**400}, "..., not a finite number"),  # beyond a double
                ("lang", {"lang": 3}, "'lang' (corpus.columns: string) is int, not a string")]


def _spoiled(change: dict) -> list[dict]:
    recs = [dict(r) for r in BASE]
    for k, v in change.items():
        if v is ...:
            del recs[2][k]
        else:
            recs[2][k] = v
    return recs


@pytest.mark.parametrize("case,change,error", RECORD_CASES, ids=[c[0] for c in RECORD_CASES])
def test_declared_values_checked_per_jsonl_record(tmp_path, case, change, error):
    """Each record's declared field is checked (missing, null, wrong type, not finite): the first
    stops the corpus naming its file and line, or with ``on_error: skip`` the record is skipped."""
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _spoiled(change)))  # NaN: JSON's NaN literal, which Python reads
    with pytest.raises(StrataInputError) as err:
        _build(tmp_path, CorpusConfig(path=str(path), columns={"score": "number", "lang": "string"}))
    assert f"{path}, line 3: " in str(err.value) and error in str(err.value), str(err.value)
    build, docs = _build(tmp_path, CorpusConfig(path=str(path), columns={"score": "number", "lang": "string"}, on_error="skip"), "skip")
    assert docs["id"].to_list() == ["d0", "d1", "d3", "d4", "d5"] and [line for line, _ in build.report.skipped] == [3]
    assert docs["score"].to_list() == [0.0, 1.0, 3.0, 4.0, 5.0] and docs["lang"].to_list() == ["en"] * 5


def test_declared_columns_checked_in_parquet_shards(tmp_path):
    """A Parquet shard: a declared column it lacks or of the wrong type names the file; a null or
    NaN value names the row (or is skipped); integer scores are read as numbers."""
    frame = pl.DataFrame(BASE)
    cases = [(frame.drop("score"), "missing column 'score' that corpus.columns declares", None),
             (frame.with_columns(pl.col("score").cast(pl.String)), "'score' (corpus.columns: number) is", None),
             (frame.with_columns(pl.when(pl.col("id") == "d2").then(None).otherwise(pl.col("score")).alias("score")), "is null", 3),
             (frame.with_columns(pl.when(pl.col("id") == "d2").then(float("nan")).otherwise(pl.col("score")).alias("score")),
              "is nan, not a finite number", 3)]
    for i, (table, error, line) in enumerate(cases):
        path = tmp_path / f"c{i}.parquet"
        table.write_parquet(path)
        with pytest.raises(StrataInputError) as err:
            _build(tmp_path, CorpusConfig(path=str(path), columns={"score": "number"}), f"out{i}")
        assert f"{path}, line {line or 1}: " in str(err.value) and error in str(err.value), str(err.value)
        if line:
            build, docs = _build(tmp_path, CorpusConfig(path=str(path), columns={"score": "number"}, on_error="skip"), f"skip{i}")
            assert docs["score"].to_list() == [0.0, 1.0, 3.0, 4.0, 5.0] and [ln for ln, _ in build.report.skipped] == [line]
    path = tmp_path / "ints.parquet"
    frame.with_columns(pl.col("score").cast(pl.Int32)).write_parquet(path)
    _, docs = _build(tmp_path, CorpusConfig(path=str(path), columns={"score": "number", "lang": "string"}), "ints")
    assert docs.schema["score"] == pl.Float64 and docs["score"].to_list() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_no_declared_columns_keep_the_corpus_fingerprints(tmp_path):
    """Without ``corpus.columns`` a shard's data version and the corpus's code version are what they
    were before the key existed; declaring a column changes both (an incremental rerun recomputes)."""
    from pipeline.data.corpus import corpus_fingerprint
    from pipeline.data.shards import _options, shard_fingerprint
    from pipeline.overrides import params_hash

    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "one document", "score": 1}) + "\n")
    plain, declared = CorpusConfig(path=str(path)), CorpusConfig(path=str(path), columns={"score": "number"})
    assert "columns" not in plain.model_dump() and "columns" not in _options(plain)
    assert shard_fingerprint(path, plain) != shard_fingerprint(path, declared)
    assert corpus_fingerprint(plain) != corpus_fingerprint(declared)
    assert params_hash(["corpus"], config_from_dict({"corpus": {"path": str(path)}})) != \
        params_hash(["corpus"], config_from_dict({"corpus": {"path": str(path), "columns": {"score": "number"}}}))
    assert config_from_dict(StrataConfig(corpus=declared.model_dump()).to_dict()).corpus.columns == {"score": "number"}


def test_declared_names_refused_at_load():
    for columns, why in [({"source": "string"}, "Strata's own"), ({"n_chars": "number"}, "Strata's own"),
                         ({"length_bin": "number"}, "characteristic family"), ({"score": "float"}, "'number' or 'string'")]:
        with pytest.raises(StrataInputError) as err:
            config_from_dict({"corpus": {"columns": columns}})
        assert "corpus.columns" in str(err.value) and why in str(err.value), str(err.value)
    with pytest.raises(StrataInputError, match="text field"):
        config_from_dict({"corpus": {"text_field": "body", "columns": {"body": "string"}}})


def test_the_builtin_corpus_has_no_declared_fields():
    from pipeline.data.corpus import read_unit
    from pipeline.data.shards import ShardReport

    with pytest.raises(StrataInputError, match="built-in corpus"):
        read_unit("builtin", CorpusConfig(columns={"score": "number"}), ShardReport("builtin"))


def test_blend_column_checked_when_the_corpus_is_known(tmp_path):
    """``mixture.column`` that neither the corpus nor Strata's later stages make stops the corpus
    stage, listing the declared corpus columns; a declared string column's groups are checked there."""
    from pipeline.config import MixtureConfig
    from pipeline.data.blend_names import check_blend_names

    corpus = tmp_path / "corpus.parquet"
    pl.DataFrame({"doc_id": [0, 1], "source": ["web", "code"], "subdomain": ["a", "b"], "content_hash": ["x", "y"],
                  "lang": ["en", "de"], "score": [0.1, 0.9]}).write_parquet(corpus)
    blend = ["random", "greedy_blend"]
    with pytest.raises(StrataInputError) as err:
        check_blend_names(corpus, MixtureConfig(column="scroe", bins=2, weights={0: 0.5, 1: 0.5}), blend)
    assert "'score'" in err.value.fix and "'lang'" in err.value.fix and "corpus.columns" in err.value.fix
    assert "content_hash" not in err.value.fix
    check_blend_names(corpus, MixtureConfig(column="score", bins=2, weights={0: 0.5, 1: 0.5}), blend)
    check_blend_names(corpus, MixtureConfig(column="n_tokens", bins=2, weights={0: 0.5, 1: 0.5}), blend)  # computed later
    with pytest.raises(StrataInputError, match="'fr'"):
        check_blend_names(corpus, MixtureConfig(column="lang", weights={"en": 0.5, "fr": 0.5}), blend)


def test_a_numeric_column_family_holds_its_token_quartiles():
    """A numeric documents column named as a family (a corpus score) is held in its token quartiles:
    every prefix of the greedy's stream keeps the quartiles' token shares far closer than without
    it, where the scores run in document order through the packing."""
    from pipeline.ordering.composition import composition, prefix_errors
    from pipeline.ordering.engine import OrderParams, run_strategy
    from pipeline.ordering.families import spec_of
    from pipeline.packing.pack import pack_concat

    rng = np.random.default_rng(3)
    n = 1200
    lengths = rng.integers(2, 220, n)
    docs = pl.DataFrame({"doc_id": np.arange(n), "cluster": rng.integers(0, 4, n), "n_tokens": lengths,
                         "score": np.sort(rng.random(n))})  # the score grows with doc_id: the packing's order is the score's
    seg = pack_concat(np.arange(n), lengths, 128).segments
    codes = spec_of("score").codes(docs)
    assert set(codes.tolist()) == {0, 1, 2, 3} and np.all(np.diff(codes) >= 0)  # token quartiles, not 1,200 categories
    quartile = codes[seg["doc_id"].to_numpy()]
    errors = []
    for params in (OrderParams(objective="f3", length_bins=16),
                   OrderParams(objective="custom", families=("cluster", "length_bin", "score"), length_bins=16)):
        order = run_strategy("greedy", docs, seg, 128, params, 0).order["sequence_id"].to_numpy()
        comp = composition(seg["sequence_id"].to_numpy(), quartile, seg["n_tokens"].to_numpy(), order.size, 4)
        position = np.empty(order.size, dtype=np.int64)
        position[order] = np.arange(order.size)
        errors.append(prefix_errors(comp, position, np.arange(16, order.size, 16)).mean())
    assert errors[1] < 0.5 * errors[0], errors

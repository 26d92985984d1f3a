"""Many small shard files grouped into a few units (``corpus.group_bytes``, issue 58 item 10): one
``corpus_shard`` partition per group, not per file; every document read once, in corpus order,
with its file and line; groups that stay put when a file is added or edited; big files alone as before."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import yaml

from pipeline.config import CorpusConfig
from pipeline.data.corpus import GROUP_MARK, build_corpus, corpus_groups, corpus_units, shard_key, unit_fingerprints, validate_unit
from pipeline.data.shards import discover_shards, group_files
from pipeline.errors import StrataInputError

N_FILES = 300
GROUP = 4096  # bytes: about 40 of the files below (each about 100 bytes) a group


def _doc(i: int) -> str:
    return json.dumps({"id": f"d{i:04d}", "text": f"document number {i} says {'abc ' * (i % 7 + 5)}", "source": "web"}) + "\n"


def _files(raw: Path, n: int = N_FILES) -> Path:
    raw.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (raw / f"f-{i:04d}.jsonl").write_text(_doc(i))
    return raw


def _cfg(raw: Path, group: int = GROUP, **kw) -> CorpusConfig:
    return CorpusConfig(path=str(raw), group_bytes=group, **kw)


def test_small_files_come_in_a_few_groups_each_file_once_in_order(tmp_path):
    raw = _files(tmp_path / "raw")
    groups = corpus_groups(_cfg(raw))
    assert 3 <= len(groups) <= 40  # one partition per file before: 300
    assert [f for fs in groups.values() for f in fs] == [str(p) for p in discover_shards(str(raw))]
    assert list(groups) == corpus_units(_cfg(raw))
    for unit, files in groups.items():
        assert unit == (files[0] + GROUP_MARK if len(files) > 1 else files[0])
        assert sum(Path(f).stat().st_size for f in files) <= 2 * GROUP
    keys = [shard_key(u) for u in groups]
    assert len(set(keys)) == len(keys)
    assert len(corpus_units(_cfg(raw, group=0))) == N_FILES  # off: a partition a file, as before


def test_big_files_stay_alone_with_todays_units_and_versions(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for k in range(3):
        (raw / f"big-{k}.jsonl").write_text("".join(_doc(k * 100 + i) for i in range(60)))
    grouped, plain = _cfg(raw, group=1024), _cfg(raw, group=0)
    assert corpus_units(grouped) == corpus_units(plain) == [str(p) for p in discover_shards(str(raw))]
    assert unit_fingerprints(grouped) == unit_fingerprints(plain)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    validate_unit(corpus_units(grouped)[0], grouped, 0.1, 0, a)
    validate_unit(corpus_units(plain)[0], plain, 0.1, 0, b)
    assert a.read_bytes() == b.read_bytes() and a.with_suffix(".json").read_bytes() == b.with_suffix(".json").read_bytes()


def test_adding_or_editing_a_file_moves_only_its_group(tmp_path):
    raw = _files(tmp_path / "raw")
    cfg = _cfg(raw)
    before = unit_fingerprints(cfg)
    (raw / "f-0150.jsonl").write_text(_doc(150).replace("document", "Document"))  # same size
    after = unit_fingerprints(cfg)
    assert list(after) == list(before)
    changed = [u for u in before if before[u] != after[u]]
    assert len(changed) == 1 and str(raw / "f-0150.jsonl") in corpus_groups(cfg)[changed[0]]
    (raw / "f-0150a.jsonl").write_text(_doc(1000))  # a new file: joins the group before it, or begins one
    added = unit_fingerprints(cfg)
    assert len(set(added.items()) - set(after.items())) <= 2
    assert len(set(after.items()) - set(added.items())) <= 1


def test_group_files_is_a_pure_cut_of_the_order():
    files = [f"/c/{i}.jsonl" for i in range(50)]
    sizes = [100] * 20 + [5000] + [100] * 29
    groups = group_files(files, sizes, 1000)
    assert [f for g in groups for f in g] == files
    assert ["/c/20.jsonl"] in groups  # at least group_bytes: alone
    assert group_files(files, sizes, 1000) == groups and group_files(files, sizes, 0) == [[f] for f in files]


def test_a_group_reads_every_file_with_its_lines_and_is_the_same_twice(tmp_path):
    raw = _files(tmp_path / "raw")
    cfg = _cfg(raw)
    unit, files = next((u, fs) for u, fs in corpus_groups(cfg).items() if len(fs) > 3)
    out, again = tmp_path / "g.parquet", tmp_path / "g2.parquet"
    info = validate_unit(unit, cfg, 0.1, 0, out, batch_rows=4)
    validate_unit(unit, cfg, 0.1, 0, again, batch_rows=4)
    assert out.read_bytes() == again.read_bytes()
    df = pl.read_parquet(out)
    assert df["id"].to_list() == [f"d{int(Path(f).stem[2:]):04d}" for f in files] and set(df["line"]) == {1}
    assert info["n_read"] == len(files) and info["files"] == [[f, 1] for f in files]
    assert pl.read_parquet(out).height == len(files)


def test_a_bad_line_in_a_group_names_its_file_and_line(tmp_path):
    raw = _files(tmp_path / "raw")
    bad = raw / "f-0123.jsonl"
    bad.write_text(_doc(123) + "{not json\n")
    cfg = _cfg(raw)
    unit = next(u for u, fs in corpus_groups(cfg).items() if str(bad) in fs)
    with pytest.raises(StrataInputError) as err:
        validate_unit(unit, cfg, 0.1, 0, tmp_path / "x.parquet")
    assert str(err.value).startswith(f"{bad}, line 2: malformed JSON")
    info = validate_unit(unit, _cfg(raw, on_error="skip"), 0.1, 0, tmp_path / "y.parquet")
    assert info["skipped"] == [[2, "f-0123.jsonl: malformed JSON (Expecting property name enclosed in double quotes at column 2)"]]


def test_the_corpus_of_groups_holds_every_document_and_names_a_repeated_id_by_file(tmp_path):
    raw = _files(tmp_path / "raw")
    cfg = _cfg(raw)
    built = build_corpus(cfg, 0, 0.1, tmp_path / "shards", tmp_path / "corpus.parquet")
    assert built.manifest.height == len(corpus_units(cfg)) < N_FILES
    assert built.report.n_read == N_FILES and int(built.manifest["n_docs"].sum()) + built.n_heldout == N_FILES
    ids = pl.read_parquet(tmp_path / "corpus.parquet")["id"].to_list()
    assert ids == sorted(ids)  # corpus order: the files' order
    (raw / "f-0200.jsonl").write_text(_doc(7))  # id d0007 again, in another group
    with pytest.raises(StrataInputError) as err:
        build_corpus(cfg, 0, 0.1, tmp_path / "shards", tmp_path / "corpus.parquet")
    assert "duplicate document id 'd0007' (records [f-0007.jsonl line 1, f-0200.jsonl line 1])" in str(err.value)
    assert str(err.value).startswith(str(raw / "f-0200.jsonl"))


@pytest.mark.integration
def test_strata_run_makes_a_partition_a_group_and_reruns_only_an_edited_one(tmp_path):
    from assets.runner import materialize_all

    raw = _files(tmp_path / "raw", 120)
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({"data_root": str(tmp_path / "root"),
                                        "corpus": {"path": str(raw), "group_bytes": GROUP}, "heldout_fraction": 0.05}))
    (tmp_path / "dagster").mkdir()
    units = corpus_units(_cfg(raw))
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        def runs() -> int:
            return len(instance.get_run_records())

        materialize_all(str(cfg_path), None, select="corpus_shards", log=lambda *_: None, log_level="WARNING", instance=instance)
        assert sorted(instance.get_dynamic_partitions("corpus_shard")) == sorted(shard_key(u) for u in units)
        assert sorted(instance.get_materialized_partitions(dg.AssetKey("corpus_shards"))) == sorted(shard_key(u) for u in units)
        first = runs()
        assert first <= len(units) < 120 / 3
        (raw / "f-0050.jsonl").write_text(_doc(50).replace("document", "Document"))
        materialize_all(str(cfg_path), None, select="corpus_shards", log=lambda *_: None, log_level="WARNING", instance=instance)
        assert runs() == first + 1  # the edited file's group only


def test_many_files_without_grouping_are_warned_once(tmp_path, monkeypatch, caplog):
    import pipeline.data.corpus as corpus

    raw = _files(tmp_path / "raw", 12)
    monkeypatch.setattr(corpus, "MANY_FILES", 10)
    with caplog.at_level("WARNING", logger="pipeline.data.corpus"):
        corpus_units(_cfg(raw, group=0))
        corpus_units(_cfg(raw, group=0))
        corpus_units(_cfg(raw))  # grouped: nothing to say
    warned = [r.getMessage() for r in caplog.records if "group_bytes" in r.getMessage()]
    assert len(warned) == 1 and "12 shard files" in warned[0], warned

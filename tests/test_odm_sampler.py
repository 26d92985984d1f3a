"""ODM outside Strata's trainer (pipeline/training/odm_sampler.py): the sampler over an export's
positions, trained with the real Hugging Face Trainer and with a plain torch DataLoader on a data
root where one cluster (random tokens) stays hard and the others (a repeated pattern) get easy."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from export_root import VOCAB, build_root, write_ordering

from pipeline.errors import StrataInputError
from pipeline.ordering.odm import sequence_clusters
from pipeline.training.odm_sampler import ODMBatchSampler, ODMCallback, ODMStream, export_clusters

L, B, STEPS = 32, 4, 60


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=L))


def exported(tmp_path, fmt: str):
    """A data root with a random ordering exported as ``fmt`` by `strata export`; (root, export dir, order, segments, store)."""
    from assets.cli import main

    root = tmp_path / "root"
    docs, seg, store = build_root(root, L)
    order = np.random.default_rng(3).permutation(store.n_sequences)
    write_ordering(root, "random", order)
    (tmp_path / "cfg.yaml").write_text(f"seq_len: {L}\nbatch_size: 8\n")
    out = tmp_path / fmt
    assert main(["export", "--data-root", str(root), "--config", str(tmp_path / "cfg.yaml"), "--strategy", "random", "--format", fmt,
                 "--out", str(out)]) == 0
    return root, out, order, docs, seg, store


def hard_probability(sampler: ODMBatchSampler, last: int = 10) -> float:
    """Mean policy probability of cluster 0 (random tokens) over the last ``last`` steps served."""
    rows = sampler.policy_rows()
    top = rows["step"].max()
    return float(rows.filter((pl.col("cluster") == 0) & (pl.col("step") > top - last))["prob"].mean())


def test_export_clusters_follow_the_lineage(tmp_path):
    root, out, order, docs, seg, _ = exported(tmp_path, "numpy")
    ids, cluster = export_clusters(out, root)
    np.testing.assert_array_equal(ids, order)
    np.testing.assert_array_equal(cluster, sequence_clusters(seg, docs["cluster"].to_numpy())[order])
    assert set(np.unique(cluster)) == {0, 1, 2}
    write_ordering(root, "random", order[::-1].copy())  # the ordering changed after the export
    with pytest.raises(StrataInputError, match="changed since the export"):
        export_clusters(out, root)
    with pytest.raises(StrataInputError, match="meta.json"):
        export_clusters(tmp_path / "nowhere", root)


def test_odm_with_the_hf_trainer(tmp_path):
    """The recipe of docs/mixture.md: ODMStream + ODMCallback in a real Trainer run on CPU."""
    datasets = pytest.importorskip("datasets")
    from transformers import Trainer, TrainingArguments

    root, out, order, _, _, store = exported(tmp_path, "hf")
    sampler = ODMBatchSampler.from_export(out, root, batch_size=B, total_steps=STEPS, seed=0)
    rows = (datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache"))
            .select_columns(["input_ids"]).with_format("torch"))
    seen = []

    def collate(batch):
        ids = torch.stack([r["input_ids"] for r in batch]).long()
        seen.append(ids.numpy().copy())
        return {"input_ids": ids, "labels": ids}

    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=STEPS, per_device_train_batch_size=B, learning_rate=1e-2,
                             gradient_accumulation_steps=1, dataloader_num_workers=0, save_strategy="no", report_to=[], use_cpu=True,
                             seed=0, logging_steps=1000)
    log = tmp_path / "run" / "odm_served.parquet"
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=ODMStream(rows, sampler), data_collator=collate,
                      callbacks=[ODMCallback(sampler, log_path=log)])
    trainer.train()
    # every optimizer step's loss reached the policy (the callback turned logging on at every step)
    assert sampler.recorded == STEPS
    assert sampler.pending <= 2  # only the micro-batches the loader fetched ahead
    assert hard_probability(sampler) > 1 / 3 + 0.05  # moved toward the cluster whose loss stays high
    served = pl.read_parquet(log)
    assert served.height == len(seen) * B
    np.testing.assert_array_equal(served["sequence_id"].to_numpy(), order[served["position"].to_numpy()])
    np.testing.assert_array_equal(served["cluster"].to_numpy(), sampler.position_cluster[served["position"].to_numpy()])
    # the Trainer trained on exactly the positions the log names, batch for batch
    np.testing.assert_array_equal(np.concatenate(seen), store.batch(served["sequence_id"].to_numpy())[0])
    # the Trainer's settings the sampler cannot work with are refused with the fix
    bad = TrainingArguments(output_dir=str(tmp_path / "bad"), max_steps=2, per_device_train_batch_size=B, gradient_accumulation_steps=2,
                            report_to=[], use_cpu=True)
    s2 = ODMBatchSampler.from_export(out, root, batch_size=B, total_steps=2)
    with pytest.raises(StrataInputError, match="gradient_accumulation_steps"):
        Trainer(model=tiny_model(), args=bad, train_dataset=ODMStream(rows, s2), data_collator=collate, callbacks=[ODMCallback(s2)]).train()


def test_odm_with_a_plain_dataloader(tmp_path):
    from torch.utils.data import DataLoader

    from pipeline.export.torch_dataset import OrderedSequences, collate_packed

    root, out, order, _, _, store = exported(tmp_path, "numpy")
    sampler = ODMBatchSampler.from_export(out, root, batch_size=B, total_steps=STEPS // 2, seed=1, accumulation=2)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen = []
    for i, batch in enumerate(DataLoader(OrderedSequences(out), batch_sampler=sampler, collate_fn=collate_packed)):
        seen.append(batch["input_ids"].numpy())
        loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        (loss / 2).backward()
        sampler.observe(loss.item())
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
    assert sampler.recorded == STEPS // 2 and sampler.pending == 0
    assert hard_probability(sampler) > 1 / 3 + 0.05
    served = sampler.served_rows()
    assert served.height == STEPS * B and served["micro_batch"].unique().sort().to_list() == [0, 1]
    np.testing.assert_array_equal(np.concatenate(seen), store.batch(served["sequence_id"].to_numpy())[0])
    sampler.write_log(tmp_path / "served.parquet")
    assert pl.read_parquet(tmp_path / "served.parquet").equals(served)
    with pytest.raises(StrataInputError, match="observed a loss"):
        sampler.observe(1.0)
    # same arguments and losses => same batches
    again = ODMBatchSampler.from_export(out, root, batch_size=B, total_steps=3, seed=1, accumulation=2)
    first = [b for b, _ in zip(again, range(2))]
    assert first == [served["position"].to_list()[:B], served["position"].to_list()[B : 2 * B]]

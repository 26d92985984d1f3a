"""A small torch dataset over a ``numpy`` export for custom trainers: rank/world-size aware,
global batch order preserved, resumable from a step.

``OrderedSequences(dir)[p]`` is the sequence at position p: ``input_ids``, ``labels`` (the
inputs, -100 at padding and at the first token of every document piece, so no token is predicted
from another document; the model shifts them as Hugging Face causal LMs do), ``position_ids``
(restarting per piece) and ``seq_lengths``. ``GlobalBatchSampler`` gives rank r of R the
positions ``[b*G + r*G/R, b*G + (r+1)*G/R)`` of step b, from ``start_step`` on; use it as a
``DataLoader`` ``batch_sampler`` (any ``num_workers``: a batch sampler keeps its order) with
``collate_packed``, which also builds flash-attention style ``cu_seqlens`` over the flattened
micro-batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset, Sampler

from pipeline.export.batches import check_batching, rank_positions
from pipeline.export.numpy_reader import open_numpy
from pipeline.export.pieces import positions_in_pieces, sequence_pieces


class OrderedSequences(Dataset):
    """Map-style dataset: index = position in the ordering."""

    def __init__(self, export_dir: str | Path):
        self.tokens, self.meta = open_numpy(export_dir)
        table = pq.read_table(Path(export_dir) / "segments.parquet")
        seg = {name: table[name].to_numpy() for name in table.column_names}
        seg["sequence_id"] = seg.pop("position")  # positions play the role of sequence ids
        self.pieces = sequence_pieces(seg, self.meta["seq_len"])

    def __len__(self) -> int:
        return int(self.meta["n_sequences"])

    @property
    def n_sequences(self) -> int:
        return len(self)

    @property
    def seq_len(self) -> int:
        return int(self.meta["seq_len"])

    def masked_batch(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(tokens (B, L) int64, segment_row (S,), segment_start (S,), filled (B, L) bool)`` of the
        sequences at ``positions``, as ``SequenceStore.masked_batch`` gives them for the same
        sequences, so Strata's own loop (``pipeline.training.loop.train``) trains on an export."""
        pos = np.asarray(positions, dtype=np.int64)
        counts, lengths, is_doc = self.pieces.of(pos)
        row = np.repeat(np.arange(pos.size), counts)
        start = (np.cumsum(lengths) - lengths) - row * self.seq_len
        filled = np.repeat(is_doc, lengths).reshape(pos.size, self.seq_len)
        return np.asarray(self.tokens[pos], dtype=np.int64), row[is_doc], start[is_doc], filled

    def __getitem__(self, p: int) -> dict[str, torch.Tensor]:
        ids = torch.from_numpy(np.asarray(self.tokens[p], dtype=np.int64))
        _, lengths, is_doc = self.pieces.of(np.array([p]))
        starts = np.cumsum(lengths) - lengths
        labels = ids.clone()
        labels[torch.from_numpy(np.repeat(~is_doc, lengths))] = -100
        labels[torch.from_numpy(starts)] = -100
        return {
            "input_ids": ids,
            "labels": labels,
            "position_ids": torch.from_numpy(positions_in_pieces(lengths).astype(np.int64)),
            "seq_lengths": torch.from_numpy(lengths.astype(np.int32)),
        }


class GlobalBatchSampler(Sampler[list[int]]):
    """This rank's positions per optimizer step, steps ``start_step`` .. (M // G) - 1."""

    def __init__(self, n_sequences: int, global_batch: int, rank: int = 0, world_size: int = 1, start_step: int = 0):
        check_batching(n_sequences, global_batch, world_size, 1)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        self.n_steps = n_sequences // global_batch
        self.global_batch, self.rank, self.world_size, self.start_step = global_batch, rank, world_size, start_step

    def __len__(self) -> int:
        return max(0, self.n_steps - self.start_step)

    def __iter__(self):
        for step in range(self.start_step, self.n_steps):
            yield rank_positions(step, self.global_batch, self.rank, self.world_size).tolist()


def collate_packed(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack a micro-batch; ``cu_seqlens`` (int32) are the piece boundaries of the flattened batch."""
    lengths = torch.cat([s["seq_lengths"] for s in samples]).to(torch.int32)
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32)
    torch.cumsum(lengths, 0, out=cu[1:])
    out = {k: torch.stack([s[k] for s in samples]) for k in ("input_ids", "labels", "position_ids")}
    out["cu_seqlens"] = cu
    out["max_seqlen"] = torch.tensor(int(lengths.max()))
    return out

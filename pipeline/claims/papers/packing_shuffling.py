"""Packing & shuffling's claims: padding reaches a lower perplexity than concat, and with documents
longer than the sequence an atom of one sequence beats the other atom sizes, at equal tokens and
in the paper's protocol (2 epochs, the last cut into 100 slices)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from pipeline.claims.measure import Claim, ClaimData, MissingData, interval_2way
from pipeline.claims.papers import ClaimSpec
from pipeline.claims.plots import plot_packing_claim, plot_packing_protocol_claim
from pipeline.errors import StrataInputError

PACKING = "Packing & shuffling"


def paired_units(units: pl.DataFrame, a: str, b: str) -> np.ndarray:
    """(seeds x held-out documents) loss of arm ``a`` minus arm ``b`` (cells both have)."""
    pa = units.filter(pl.col("arm") == a).select("seed", "unit", la="loss")
    pb = units.filter(pl.col("arm") == b).select("seed", "unit", lb="loss")
    d = pa.join(pb, on=["seed", "unit"], how="inner").with_columns(d=pl.col("la") - pl.col("lb"))
    if d.height == 0:
        return np.zeros((0, 0))
    m = d.sort("seed", "unit").pivot(on="unit", index="seed", values="d").sort("seed").drop("seed").to_numpy().astype(np.float64)
    return m[:, ~np.isnan(m).any(axis=0)]


def _ppl(units: pl.DataFrame, arm: str) -> float:
    return float(np.exp(units.filter(pl.col("arm") == arm)["loss"].mean()))


def packing_claims(data: ClaimData) -> list[Claim]:
    """Packing & shuffling: padding reaches a lower perplexity than concat at equal (non-padding)
    tokens, and with documents longer than seq_len an atom of seq_len beats 0.5x and 2x seq_len.
    Runs of ``claim_runs`` (plain causal attention over the whole sequence, as the paper trains),
    scored on the fixed held-out batch. Strata's figure: the difference of held-out loss
    (nats/token; claimed < 0), perplexities in the detail. Interval: two-way bootstrap over seeds x
    held-out documents."""
    units = data.claim_heldout
    if units is None or units.filter(pl.col("experiment") == "packing").height == 0:
        if data.claim_sequences is not None and data.claim_sequences.filter(pl.col("experiment") == "packing_epochs").height:
            return []  # the packing runs are in the paper's protocol (packing_paper_protocol's rows)
        raise MissingData("needs the claims' packing runs at equal tokens "
                          "(strata claims --full with claims_packing_protocol: equal_tokens)")
    units = units.filter(pl.col("experiment") == "packing")
    arms = data.claim_arms.filter(pl.col("experiment") == "packing") if data.claim_arms is not None else None
    path = str(plot_packing_claim(units, data.figure("claim_packing")))
    note = ""
    if arms is not None and arms.height:
        doc, seq_len = float(arms["mean_doc_tokens"][0]), int(arms["seq_len"][0])
        note = f"; mean document {doc:.0f} tokens vs seq_len {seq_len}" + ("" if doc > seq_len
                                                                           else " (the claim's condition does not hold)")
    steps = dict(arms.group_by("arm").agg(pl.col("steps").first()).iter_rows()) if arms is not None and arms.height else {}
    out = []
    specs = [("padding-x1", "concat-x1", "padding reaches a lower perplexity than concat at equal tokens",
              "lower by 5-24% (Table 3; MSL 64: 99.79 vs 110.45)", "Table 3 (GPT-2 124M, WikiText)")]
    for other in ("concat-x0.5", "concat-x2", "concat-x0.25", "concat-x4"):
        if other in set(units["arm"]):
            specs.append(("concat-x1", other, f"atom size = seq_len beats {other.split('-x')[1]} x seq_len (documents longer than seq_len)",
                          {"concat-x0.5": "118.08 vs 157.39", "concat-x2": "118.08 vs 119.66", "concat-x0.25": "118.08 vs 207.04",
                           "concat-x4": "118.08 vs 121.18"}[other] + " (concat, MSL 64)", "Table 2 (concat, MSL 64)"))
    for a, b, text, quote, source in specs:
        d = paired_units(units, a, b)
        if d.size == 0:
            continue
        mean, lo, hi = interval_2way(d, data.n_boot, data.seed)
        out.append(Claim(
            key=f"packing.{a}_vs_{b}", paper=PACKING, claim=text, paper_figure=f"final perplexity {quote}", paper_source=source,
            value=mean, ci_low=lo, ci_high=hi, threshold=0.0, side="<",
            interval=f"two-way bootstrap over {d.shape[0]} seeds x {d.shape[1]} held-out documents", n=int(d.size),
            detail=f"held-out loss {a} minus {b} (nats/token); perplexity {_ppl(units, a):.1f} vs {_ppl(units, b):.1f}"
                   f" after {steps.get(a, '?')} vs {steps.get(b, '?')} steps{note}",
            figure=path,
        ))
    return out


PACKING_QUOTES = {"concat-x0.5": "118.08 vs 157.39", "concat-x2": "118.08 vs 119.66", "concat-x0.25": "118.08 vs 207.04",
                  "concat-x4": "118.08 vs 121.18"}
PACKING_RANKS = {"concat-x0.25": 5.00, "concat-x0.5": 4.00, "concat-x1": 1.05, "concat-x2": 1.96, "concat-x4": 2.99}  # Table 2, concat


def slice_log_perplexity(seqs: pl.DataFrame, n_slices: int = 100) -> pl.DataFrame:
    """Packing & shuffling's Appendix A.6 on per-sequence training losses: each run's last epoch cut
    into ``n_slices`` slices by the sequence's position in the epoch (slice = floor(index x n /
    epoch_size), each 1/n of the epoch), and each slice's log perplexity = its summed loss / its
    tokens (the token-weighted mean loss). ``seqs``: arm, seed, epoch, index, epoch_size,
    loss_sum, tokens. Returns arm, seed, slice, log_ppl; every slice must hold a sequence."""
    last = seqs.group_by("arm", "seed").agg(pl.col("epoch").max().alias("last"))
    s = (seqs.join(last, on=["arm", "seed"]).filter(pl.col("epoch") == pl.col("last"))
         .with_columns(slice=(pl.col("index") * n_slices // pl.col("epoch_size")).cast(pl.Int64)))
    out = (s.group_by("arm", "seed", "slice").agg(log_ppl=pl.col("loss_sum").sum() / pl.col("tokens").sum())
           .sort("arm", "seed", "slice"))
    counts = out.group_by("arm", "seed").len()
    if counts.height and int(counts["len"].min()) < n_slices:
        raise StrataInputError(f"a run's last epoch fills {int(counts['len'].min())} of {n_slices} slices",
                               fix="train at least as many sequences per epoch as slices (raise claims_packing_sequences)")
    return out


def slice_matrix(lp: pl.DataFrame, arm: str) -> tuple[list[int], np.ndarray]:
    """(seeds, seeds x slices log perplexity) of one arm."""
    sel = lp.filter(pl.col("arm") == arm)
    if sel.height == 0:
        return [], np.zeros((0, 0))
    wide = sel.pivot(on="slice", index="seed", values="log_ppl").sort("seed")
    return wide["seed"].to_list(), wide.drop("seed").to_numpy().astype(np.float64)


def mean_ranks(lp: pl.DataFrame, arms: list[str]) -> dict[str, float]:
    """The paper's perplexity ranking: in every (seed, slice) the arms ranked by slice perplexity
    (1 = lowest), averaged over slices and seeds."""
    sel = lp.filter(pl.col("arm").is_in(arms)).with_columns(rank=pl.col("log_ppl").rank("average").over("seed", "slice"))
    return dict(sel.group_by("arm").agg(pl.col("rank").mean()).iter_rows())


def _protocol_note(arms: pl.DataFrame | None, seqs: pl.DataFrame) -> str:
    """The paper-protocol runs' epochs, MSL and mean document length, for the rows' detail, and
    whether the paper's condition (mean document length > MSL) holds ("" when the arms do not say)."""
    arms = arms.filter(pl.col("experiment") == "packing_epochs") if arms is not None else None
    if arms is None or not arms.height:
        return ""
    doc, msl = float(arms["mean_doc_tokens"].mean()), int(arms["seq_len"][0])
    epochs = int(seqs["epoch"].max()) + 1
    return (f"; {epochs} epochs at MSL {msl}, mean document {doc:.0f} tokens"
            + ("" if doc > msl else " (the paper's condition, mean document length > MSL, does not hold)"))


def _protocol_comparisons(concat: list[str]) -> list[tuple[str, str, str, str, str]]:
    """``(arm a, arm b, the claim, the paper's figure, where it stands)`` of each comparison: padding
    against concat at atom = MSL, then atom = MSL against every other concat atom present."""
    specs = [("padding-x1", "concat-x1", "padding reaches a lower final perplexity than concat (atom = MSL)",
              "lower by 5-24% (Table 3; MSL 64: 99.79 vs 110.45)", "Table 3; Appendix A.6 (final perplexity, 2 epochs)")]
    specs += [("concat-x1", o, f"atom size = MSL beats {o.split('-x')[1]} x MSL (concat; documents longer than the MSL)",
               PACKING_QUOTES.get(o, "lower") + " (concat, MSL 64)", "Table 2; Appendix A.6 (final perplexity and ranking, 2 epochs)")
              for o in concat if o != "concat-x1"]
    return specs


def packing_protocol_claims(data: ClaimData) -> list[Claim]:
    """Packing & shuffling in the paper's protocol (``claims_packing_protocol: paper``): every arm
    trains 2 epochs over its own packing of the same documents, at an MSL below the mean document
    length; the last epoch is cut into 100 slices of 1% (Appendix A.6). Two rows per comparison
    (padding vs concat at atom = MSL; atom = MSL vs each other atom, concat):

    - *final perplexity*: the last slice's (0.99-1.00 of the last epoch) log perplexity, a minus b,
      mean over seeds; claimed < 0. Interval: bootstrap over seeds (the only independent unit).
    - *ranking over the 100 slices*: the fraction of (seed, slice) cells in which a's slice
      perplexity is below b's; claimed > 0.5. Interval: two-way bootstrap over seeds x slices
      (neighbouring slices of one run are correlated, so it is narrower than seeds alone would
      give). The paper's average rankings among all arms are in the detail beside Strata's.
    """
    seqs = data.claim_sequences
    if seqs is None or seqs.filter(pl.col("experiment") == "packing_epochs").height == 0:
        raise MissingData("needs the claims' packing runs in the paper's protocol (strata claims --full; claims_packing_protocol: paper)")

    seqs = seqs.filter(pl.col("experiment") == "packing_epochs")
    lp = slice_log_perplexity(seqs)
    path = str(plot_packing_protocol_claim(lp, data.figure("claim_packing_protocol")))
    note = _protocol_note(data.claim_arms, seqs)
    present = set(lp["arm"])
    concat = sorted((a for a in present if a.startswith("concat-x")), key=lambda a: float(a.split("-x")[1]))
    ranks = mean_ranks(lp, concat)
    rank_note = "; mean rank among " + ", ".join(f"{a.split('-x')[1]}x {ranks[a]:.2f}"
                                                 + (f" [paper {PACKING_RANKS[a]:.2f}]" if a in PACKING_RANKS else "")
                                                 for a in concat)
    out = []
    for a, b, text, quote, source in _protocol_comparisons(concat):
        sa, ma = slice_matrix(lp, a)
        sb, mb = slice_matrix(lp, b)
        if sa != sb or ma.size == 0:
            continue
        final = (ma[:, -1] - mb[:, -1])[:, None]
        mean, lo, hi = interval_2way(final, data.n_boot, data.seed)
        ppl = f"final perplexity {math.exp(ma[:, -1].mean()):.1f} vs {math.exp(mb[:, -1].mean()):.1f} (geometric mean over seeds)"
        out.append(Claim(
            key=f"packing.paper.final.{a}_vs_{b}", paper=PACKING,
            claim=f"{text}: final perplexity, last 1% of epoch {int(seqs['epoch'].max()) + 1}",
            paper_figure=f"final perplexity {quote}", paper_source=source, value=mean, ci_low=lo, ci_high=hi, threshold=0.0, side="<",
            interval=f"bootstrap over {len(sa)} seeds", n=len(sa),
            detail=f"log perplexity of the last slice (0.99-1.00 of the last epoch), {a} minus {b}; {ppl}{note}", figure=path,
        ))
        below = (ma < mb).astype(np.float64)
        mean, lo, hi = interval_2way(below, data.n_boot, data.seed)
        out.append(Claim(
            key=f"packing.paper.rank.{a}_vs_{b}", paper=PACKING, claim=f"{text}: ranked over the last epoch's 100 slices",
            paper_figure=("perplexity ranking 1.05 (1 MSL) of 5 atoms (Table 2)" if b != "concat-x1" and a == "concat-x1"
                          else "lower final perplexity (Figure 3: padding below concat through the last epoch)"),
            paper_source=source, value=mean, ci_low=lo, ci_high=hi, threshold=0.5, side=">",
            interval=f"two-way bootstrap over {len(sa)} seeds x {ma.shape[1]} slices", n=int(below.size),
            detail=f"fraction of (seed, slice) cells with {a}'s slice perplexity below "
                   f"{b}'s{rank_note if a.startswith('concat') else ''}{note}",
            figure=path,
        ))
    if not out:
        raise MissingData("the paper-protocol packing runs share no seed between the compared arms")
    return out

SPECS = (
    ClaimSpec("packing", PACKING, "padding beats concat, and atom = seq_len beats 0.5x and 2x, at equal tokens (held-out loss)",
              packing_claims, inputs=("claim_heldout", "claim_arms", "claim_sequences"), order=90),
    ClaimSpec("packing_paper_protocol", PACKING, "padding beats concat, and atom = MSL beats the other atoms, over 2 epochs "
              "(the paper's protocol)", packing_protocol_claims, inputs=("claim_sequences", "claim_arms"), order=100),
)

"""Running per-shard work and ablation runs on the local engine or on a Ray cluster (docs/distributed.md)."""

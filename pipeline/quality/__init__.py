"""Quality scores per document: a scorer of the registry (``scorers/``) over each corpus shard
(``quality_shards``), gathered into the documents' ``quality`` column with an optional filter
(``quality``). docs/quality.md."""

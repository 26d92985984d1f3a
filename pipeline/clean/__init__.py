"""Cleaning before ordering: exact, near and semantic duplicates of the training documents and
their n-gram overlap with the evaluation sets (docs/cleaning.md). One stage, ``clean``
(:func:`pipeline.clean.stage.clean_documents`), after the embeddings and clusters; the packing and
the document-level orderings leave out the documents it removes."""

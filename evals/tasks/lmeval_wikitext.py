"""lm-eval's own wikitext detokenizer and result hook, re-exported beside the YAML."""

from lm_eval.tasks.wikitext.preprocess_wikitext import process_results, wikitext_detokenizer

__all__ = ["process_results", "wikitext_detokenizer"]

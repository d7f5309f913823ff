"""Rerank models: a query and documents in, one relevance score per document out."""

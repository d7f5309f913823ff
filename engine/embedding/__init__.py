"""Embedding models: text in, one vector per input out (no KV cache, no sampling)."""

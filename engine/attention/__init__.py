"""Attention over the paged KV cache: the backend protocol and metadata, the torch, C++ (CPU) and Triton backends, and the choice among them."""

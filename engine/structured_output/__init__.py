"""Grammar-constrained decoding (structured outputs) with xgrammar: specs, their compiled
grammars, each sequence's matcher, and the per-step token masks the sampler applies."""

from officellm.engine.structured_output.params import StructuredOutputError, StructuredOutputsParams

__all__ = ["StructuredOutputError", "StructuredOutputsParams"]

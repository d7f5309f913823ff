"""The engine's front end: requests in (sampling parameters, prompts to core requests) and
results out (detokenization, stop strings, outputs), built on a loaded model's tokenizer."""

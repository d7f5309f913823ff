"""Finding a model's files (a GGUF converted once to a Hugging Face directory), its config, its weights."""

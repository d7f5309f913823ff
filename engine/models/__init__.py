"""Model implementations (one decoder covers the Llama family, Qwen2 and Qwen3)."""

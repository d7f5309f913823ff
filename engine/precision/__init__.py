"""What the engine computes and stores in, chosen at run time: the model's dtype from the
CPU's flags, the KV cache's dtype, `--quantization auto`'s measured choice of weight format,
and the per-machine cache of such measured choices."""

"""The KV cache's tiers below the pool: full blocks kept on disk, encrypted per install and
reachable per prefix-cache salt, so an agent's long instructions outlive a restart, an idle
sleep and a model's unload (docs/kv_tiers.md)."""

"""The models a server serves (the model wing): each served model and embedder, their prompts
and token text, idle sleep, the registry kept in step with them (registry_sync.py), the
memory budget loads are planned in, and the pool that loads them on demand and owns their
leases."""

"""The models a server serves (the model wing): each served model and embedder, their prompts
and token text, idle sleep, and the pool that loads them on demand within the memory budget
and owns their leases."""

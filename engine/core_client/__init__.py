"""How AsyncLLM drives an engine core: on a thread of its own in this process, or in a
process of its own (the server's default), behind one interface (core_client.py)."""

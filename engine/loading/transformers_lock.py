"""One thread at a time through transformers' loading code (and sentence-transformers', which
is built on it).

transformers imports its classes lazily, at first use. Two threads making first uses at once
(a server loading a chat model's tokenizer while it loads an embedding model) can each hold a
module the other is importing; Python breaks that cycle by handing one of them the
half-imported module, and the load fails with "cannot import name 'AutoTokenizer' from
'transformers'" (it did, in CI). Every loader that goes through transformers holds this lock
while it does: loads are rare and short, so serializing them costs nothing that matters.
"""

from __future__ import annotations

import threading

# Reentrant: a loader holding it may call another (a GGUF's tokenizer inside a model load).
TRANSFORMERS = threading.RLock()

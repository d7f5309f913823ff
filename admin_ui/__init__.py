"""The officellm admin console (PySide6): `officellm admin`.

It talks to the server only over the HTTP admin API (`docs/admin_api.md`), so it can watch a
server on this desk or on another one. Qt is imported by the modules that need it, never here,
so the pure parts (stats parsing, diagnosis rules, reading the capacity plan, the local-server
manager) can be used and tested without a display.
"""

"""`python -m officellm.cli`: the `officellm` command, for launchers that run the interpreter
(the admin console, the tests, the benchmarks) rather than the installed script."""

from __future__ import annotations

from officellm.cli import main

if __name__ == "__main__":
    main()

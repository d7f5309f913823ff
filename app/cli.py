"""The `officellm` command."""


def main() -> None:  # replaced by the full CLI
    raise SystemExit("officellm: not built yet")

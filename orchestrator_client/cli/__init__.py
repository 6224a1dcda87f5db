"""``orch``: the command line (typer + rich) on the SDK."""


def main() -> None:
    raise SystemExit("orch: not built yet")

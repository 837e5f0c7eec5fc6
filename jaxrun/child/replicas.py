"""Child side of ``--checks``: replicas built from per-process data agree (being built)."""


def install(board, strict: bool) -> None:
    del board, strict

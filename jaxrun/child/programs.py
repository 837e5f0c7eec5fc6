"""Child side of ``--checks``: programs that span processes agree (being built)."""


def install(board, strict: bool) -> None:
    del board, strict

"""The kernel wrappers' input contracts. A Triton kernel reads raw pointers, so a wrong layout reads wrong
memory instead of failing: each wrapper checks what its kernel assumes here, as a ``ValueError`` that says
what is required (an ``assert`` would vanish under ``python -O``). The messages are constant strings: the
checks run on every eager call."""


def require(ok: bool, contract: str) -> None:
    """Raise ``ValueError(contract)`` unless ``ok``; ``contract`` says what the kernel requires."""
    if not ok:
        raise ValueError(contract)

"""The context-manager half of the clients: `with Client(...) as c:` closes c on leaving."""

from __future__ import annotations

from typing import Self

__all__ = ["ClosedOnExit"]


class ClosedOnExit:
    """A base for classes with a close(): entering returns the object, leaving closes it (however
    the block ends)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

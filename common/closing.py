"""Closing: the base of objects that hold a resource until close(), so `with` closes them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Closing(ABC):
    """`with obj:` closes obj on the way out, whatever ended the block.

    One base instead of the same __enter__/__exit__ pair on every class that
    owns files, processes or shared memory.
    """

    @abstractmethod
    def close(self) -> None:
        """Releases what the object holds; calling it again does nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

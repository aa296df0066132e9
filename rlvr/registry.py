"""One small registry type used by every extension point (advantages, losses, KL, verifiers, engines)."""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> object map with a decorator for registration.

    Errors: ``KeyError`` on an unknown name, naming the nearest registered names; ``ValueError`` when a
    name is registered twice.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._flags: dict[str, dict[str, bool]] = {}

    def register(self, name: str, **flags: bool) -> Callable[[T], T]:
        """Decorator registering ``name``. ``flags``: what the entry needs or produces, asked by the recipe checks
        instead of names (e.g. ``needs_groups=True``: advantages compared within a group of G >= 2 samples)."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            self._flags[name] = dict(flags)
            return obj

        return deco

    def add(self, name: str, obj: T, **flags: bool) -> None:
        self.register(name, **flags)(obj)

    def flag(self, name: str, flag: str) -> bool:
        """The entry's ``flag`` (False when it did not declare it, or ``name`` is not registered)."""
        return self._flags.get(name, {}).get(flag, False)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            near = difflib.get_close_matches(name, list(self._items), n=3)
            hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
            raise KeyError(
                f"unknown {self.kind} {name!r}.{hint} Registered: {', '.join(sorted(self._items))}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)

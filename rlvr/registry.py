"""One small registry type used by every extension point (advantages, losses, KL, verifiers, engines)."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """The settings of an entry that has none (``advantage: rloo`` takes no fields)."""


class Registry(Generic[T]):
    """Name -> object map with a decorator for registration; each entry may own a frozen settings dataclass
    (the fields a recipe may give it: ``advantage: {name: passk, k: 4}``) and capability flags.

    A settings class may define ``errors(self, recipe, where: str) -> list[str]``: its invariants against the
    whole recipe (e.g. ``k <= rollout.samples_per_prompt``), each message naming ``where`` + the field and the fix;
    :func:`rlvr.recipe.load_recipe` collects them with the other recipe errors.

    Errors: ``KeyError`` on an unknown name, naming the nearest registered names; ``ValueError`` when a
    name is registered twice.
    """

    def __init__(self, kind: str, flags: tuple[str, ...] = ()) -> None:
        """``flags``: the capability flags entries of this registry may declare (any other name is refused)."""
        self.kind = kind
        self.known_flags = frozenset(flags)
        self._items: dict[str, T] = {}
        self._flags: dict[str, dict[str, bool]] = {}
        self._settings: dict[str, type] = {}

    def register(self, name: str, *, settings: type = NoSettings, **flags: bool) -> Callable[[T], T]:
        """Decorator registering ``name``. ``settings``: the entry's frozen dataclass of recipe fields (built by the
        recipe loader and passed to the entry; :class:`NoSettings` when it has none). ``flags``: what the entry needs
        or produces, asked by the recipe checks instead of names (e.g. ``needs_groups=True``: advantages compared
        within a group of G >= 2 samples), each one of the registry's ``known_flags``. Errors: ``ValueError`` on a
        second registration of ``name``, an unknown flag (with the nearest), or ``settings`` that is not a frozen
        dataclass."""
        unknown = sorted(set(flags) - self.known_flags)
        if unknown:
            near = {f: difflib.get_close_matches(f, self.known_flags, n=1) for f in unknown}
            hints = ", ".join(f"{f!r}" + (f" (did you mean {n[0]!r}?)" if n else "") for f, n in near.items())
            raise ValueError(f"{self.kind} {name!r}: unknown flag {hints}; this registry's flags: "
                             f"{sorted(self.known_flags) or 'none'}")  # fmt: skip
        params = getattr(settings, "__dataclass_params__", None)
        if params is None or not params.frozen:
            raise ValueError(f"{self.kind} {name!r}: settings must be a frozen dataclass, got {settings!r}")

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            self._flags[name] = dict(flags)
            self._settings[name] = settings
            return obj

        return deco

    def add(self, name: str, obj: T, *, settings: type = NoSettings, **flags: bool) -> None:
        self.register(name, settings=settings, **flags)(obj)

    def settings(self, name: str) -> type:
        """The settings dataclass of entry ``name``. Errors: ``KeyError`` as :meth:`get`."""
        self.get(name)
        return self._settings[name]

    def settings_of(self, spec: Any) -> Any:
        """The settings instance of a :class:`rlvr.config.Spec` naming an entry of this registry: ``spec.settings``
        when resolved, every field at its default when it is None. Errors: ``KeyError`` on an unknown name;
        ``TypeError`` on a spec whose settings are still the recipe's raw mapping (load recipes with
        :func:`rlvr.recipe.load_recipe`, which resolves them) or belong to another entry."""
        cls = self.settings(spec.name)
        if spec.settings is None:
            return cls()
        if not isinstance(spec.settings, cls):
            raise TypeError(
                f"{self.kind} {spec.name!r}: settings {spec.settings!r} are not {cls.__name__} (an unresolved recipe? "
                "load it with rlvr.recipe.load_recipe)"
            )
        return spec.settings

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


def check_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any], where: str) -> None:
    """Check a recipe's keyword arguments for ``fn`` (a class: its constructor; a function) against its signature
    before anything calls it, so a typo fails at load with the recipe key instead of a ``TypeError`` in a role.

    ``where``: the recipe key that holds ``kwargs`` (``reward.verifiers[0].args``); each error names
    ``where.<name>``. A signature with ``**kwargs`` takes any name; one that cannot be read (a builtin) is not
    checked. Errors: :class:`~rlvr.config.RecipeError` naming an unknown name with its nearest parameter
    (difflib, as unknown recipe keys) and the names ``fn`` takes, or a required parameter left out.
    """
    import inspect

    from rlvr.config import RecipeError

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    label = getattr(fn, "__name__", None) or repr(fn)
    takes = f"{label} takes {', '.join(named)}" if named else f"{label} takes no arguments"
    for key in kwargs:
        if key not in named:
            near = difflib.get_close_matches(str(key), named, n=1, cutoff=0.5)
            hint = f"did you mean '{where}.{near[0]}'? ({takes})" if near else takes
            raise RecipeError(f"unknown key '{where}.{key}': {hint}")
    missing = [p.name for p in params if p.name in named and p.default is p.empty and p.name not in kwargs]
    if missing:
        raise RecipeError(f"'{where}' lacks {', '.join(missing)}: {label} needs {'it' if len(missing) == 1 else 'them'} "
                          f"(no default); add {', '.join(f'{where}.{m}' for m in missing)}")

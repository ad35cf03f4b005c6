"""Training methods by name: ``METHODS[cfg.method](cfg, translator, model)``. Every ``Method``
subclass of this package with a ``name`` is one: a new method's module needs no entry here."""

from __future__ import annotations

import difflib
import importlib
import pkgutil

from qeebm.errors import QeebmError
from qeebm.methods.base import Batch, Method, StepOutput


class _Registry(dict):
    # A plain KeyError would surface as a traceback; a config typo deserves the one-line error.
    def __missing__(self, name):
        match = difflib.get_close_matches(str(name), list(self), n=1, cutoff=0.0)
        hint = f" (did you mean '{match[0]}'?)" if match else ""
        raise QeebmError(f"unknown method '{name}'{hint}; known methods: {', '.join(sorted(self))}")


def _methods() -> dict[str, type]:
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found, todo = {}, list(Method.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.name != Method.name:
            if found.setdefault(cls.name, cls) is not cls:
                raise QeebmError(f"two methods named '{cls.name}': {found[cls.name].__qualname__} and {cls.__qualname__}")
    return dict(sorted(found.items()))


METHODS: dict[str, type] = _Registry(_methods())

__all__ = ["METHODS", "Batch", "Method", "StepOutput"]

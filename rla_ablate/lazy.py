"""A package's public names imported from their modules on first use (PEP 562), not when the package is.

`rla_ablate.sweep`, `.train` and `.models` name classes and functions whose modules import torch, Ray or MLflow.
Read-only commands (`rla-sweep status`, `cancel`) import a few light modules of these packages; with eager
package imports each paid for torch first (2.4 s of a 2.4 s `status`)."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def exports(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: `where` maps each public name to the submodule that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return __getattr__

"""A notebook's parameters: taken once from its parameters cell, checked before anything runs.

The parameters cell is a list of literal assignments (Colab renders them as a form, papermill overrides
them, Kaggle and Jupyter users edit them in place). The cell after it hands ``globals()`` to
:func:`parameters`, which picks those assignments up, so each parameter is named exactly once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import UserInputError

# Names a Jupyter kernel defines before any cell runs: never parameters.
KERNEL_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}
PARAMETER_TYPES = (str, int, float, bool)
# Placeholders the notebooks ship with, e.g. gs://YOUR_BUCKET or /kaggle/input/your-dataset.
PLACEHOLDER = re.compile(r"YOUR[_-][A-Z0-9_-]+", re.IGNORECASE)


class Parameters:
    """The notebook's parameters as attributes (``P.run_name``), in the order the cell defines them."""

    def __init__(self, values: Mapping[str, Any]):
        self._values = dict(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"this notebook has no parameter {name!r}") from None

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def set(self, name: str, value: Any) -> None:
        self._values[name] = value

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def paths(self) -> dict[str, str]:
        """The parameters that name a place (a local or Drive folder, a gs:// URL, a Kaggle input)."""
        return {name: value for name, value in self._values.items()
                if isinstance(value, str) and ("/" in value or value.startswith("gs:"))}

    def __repr__(self) -> str:
        width = max((len(name) for name in self._values), default=0)
        return "\n".join(f"  {name:<{width}} = {value!r}" for name, value in self._values.items())


def parameters(namespace: Mapping[str, Any]) -> Parameters:
    """The literal values the parameters cell (and papermill) assigned in ``namespace`` (a kernel's globals)."""
    return Parameters({name: value for name, value in namespace.items()
                       if not name.startswith("_") and name not in KERNEL_NAMES
                       and isinstance(value, PARAMETER_TYPES)})


def check_placeholders(params: Parameters) -> None:
    """Refuse, before anything runs, parameters still holding a placeholder such as ``gs://YOUR_BUCKET``."""
    left = {name: value for name, value in params.as_dict().items()
            if isinstance(value, str) and PLACEHOLDER.search(value)}
    if left:
        listed = "; ".join(f"{name} = {value!r}" for name, value in left.items())
        raise UserInputError(f"Replace the placeholder in the parameters cell first: {listed}. Put your own "
                             "bucket, dataset or folder there (or leave it empty where the help says empty works).")

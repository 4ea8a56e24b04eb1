"""Deprecated name of :mod:`chatflow_agent.inspector`, kept for one release.

``python -m chatflow_agent.inspect PATH [--json]`` still runs the inspector, with a
``DeprecationWarning``: this module's name shadows the standard library's ``inspect``. Use
``python -m chatflow_agent.inspector``. Its public names (``inspect_database``, ``DatabaseReport``, ``main`` …) are
the inspector's, and reading one through this module warns too.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

MOVED = ("chatflow_agent.inspect is deprecated and will be removed: use chatflow_agent.inspector "
         "(python -m chatflow_agent.inspector)")


def __getattr__(name: str) -> Any:
    from chatflow_agent import inspector

    if not name.startswith("_") and hasattr(inspector, name):  # every public name the module had
        warnings.warn(MOVED, DeprecationWarning, stacklevel=2)
        return getattr(inspector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    from chatflow_agent import inspector

    return sorted({*globals(), *(n for n in dir(inspector) if not n.startswith("_"))})


if __name__ == "__main__":
    warnings.warn(MOVED, DeprecationWarning, stacklevel=1)  # attributed to __main__: shown by default
    from chatflow_agent.inspector import main

    sys.exit(main())

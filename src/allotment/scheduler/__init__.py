"""The scheduling core: pure functions and state of one scheduler, no I/O, no clock.

``make`` compiles the modules of this package (all but this file) with mypyc into
extension modules beside their sources: the same code, typed, run as C, with the same
decisions. They are imported while every one is newer than every source they were
built from (this package's and ``allotment.domain``'s, the only one it imports); when
one changed since (or ``ALLOT_PURE_CORE=1`` is set), the sources are imported instead,
so an edit takes effect at once and ``make`` builds them again.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, SOURCE_SUFFIXES, FileFinder, SourceFileLoader
from pathlib import Path


def _compiled_is_current(folder: Path, imported: Path) -> bool:
    """Whether ``folder``'s compiled modules are all there and newer than its sources
    and those of the package it imports (``imported``)."""
    if os.environ.get("ALLOT_PURE_CORE", "") not in ("", "0"):
        return False
    try:
        files = list(folder.iterdir())
        upstream = [f for f in imported.iterdir() if f.suffix == ".py"]
    except OSError:
        return False
    built = [f for f in files if f.name.endswith(EXTENSION_SUFFIXES[0])]
    sources = [f for f in files if f.suffix == ".py" and f.name != "__init__.py"]
    if not sources or {f.stem for f in sources} - {f.name.split(".")[0] for f in built}:
        return False  # not built, or a module was added since
    newest_source = max(f.stat().st_mtime for f in sources + upstream)
    return min(f.stat().st_mtime for f in built) >= newest_source


_HERE = Path(__file__).resolve().parent
COMPILED = _compiled_is_current(_HERE, _HERE.parent / "domain")
"""Whether this package's modules run compiled (mypyc) in this process."""
if not COMPILED:
    # The package's modules are looked up through these finders: sources only.
    for _folder in __path__:
        sys.path_importer_cache[_folder] = FileFinder(_folder, (SourceFileLoader, SOURCE_SUFFIXES))

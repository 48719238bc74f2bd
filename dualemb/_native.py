"""Locates and loads the compiled parts of dualemb.

Installed (also editable) builds put the binaries in the ``dualemb`` package directory of
site-packages, which an editable install's Python files do not share; so binaries are found
from the extension module's own ``__file__``, never from this file's directory. Setting
``DUALEMB_NATIVE_DIR`` to a CMake build's ``<build>/dualemb`` directory uses that build instead
(for development without reinstalling).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys

_ENV = "DUALEMB_NATIVE_DIR"


def _load_from(directory: str, name: str):
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(directory, name + suffix)
        if os.path.exists(path):
            full = "dualemb." + name
            spec = importlib.util.spec_from_file_location(full, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[full] = module
            return module
    raise ImportError(f"{name} not found in {directory} (set by {_ENV})")


def load_extension(name: str):
    """Imports the extension module ``dualemb.<name>``."""
    full = "dualemb." + name
    if full in sys.modules:
        return sys.modules[full]
    directory = os.environ.get(_ENV)
    if directory:
        return _load_from(directory, name)
    try:
        return importlib.import_module(full)
    except ImportError as e:
        raise ImportError(
            f"dualemb's compiled module {full} is missing ({e}). Install the package with the "
            "README's install command, which builds the C++ parts."
        ) from e


def native_dir() -> str:
    """Directory that holds libdualemb_core.so and the front-end binaries."""
    return os.path.dirname(os.path.abspath(load_extension("_core").__file__))

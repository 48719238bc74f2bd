"""The jaxlib release dualemb._jax_ffi was built against must be the one imported.

The XLA FFI handlers (csrc/jax) are compiled against the FFI headers of the jaxlib present at
build time (``jax.ffi.include_dir()``): the header-only C++ layer, the struct layouts and the
data-type codes are compiled into the module. XLA promises old FFI API versions only for a
limited time (xla/ffi/api/c_api.h: "at least 12 months"), and a newer header may use fields an
older runtime lacks, so a module built against another jaxlib release could fail obscurely or,
worse, misread a buffer. The check is on the release series (major.minor): patch releases of one
series share the FFI headers; any other series is refused with a message naming both and the fix,
before a handler is registered.
"""

from __future__ import annotations

import re

REBUILD_HINT = (
    "rebuild dualemb against the installed jax (rerun the README's install command, "
    "`pip install --no-build-isolation -e \".[jax,...]\"`, or tools/dev_build.sh for a "
    "development build), or install jax/jaxlib {series}.* again")


def release_series(version: str) -> tuple[int, int]:
    """(major, minor) of a jaxlib version string such as ``0.11.2`` or ``0.12.0.dev20260101``."""
    m = re.match(r"\s*(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"cannot read a jaxlib version from {version!r}")
    return int(m.group(1)), int(m.group(2))


def check_jaxlib(built: str | None, running: str, ffi_api=None) -> None:
    """Raises ImportError unless ``running`` (the imported jaxlib's version) is of the same
    release series as ``built`` (the one dualemb._jax_ffi was compiled against; None for a
    module built before it reported one)."""
    if built is None:
        raise ImportError(
            "dualemb._jax_ffi does not say which jaxlib it was built against (a build older "
            f"than this Python package); this process imports jaxlib {running}: "
            + REBUILD_HINT.format(series="the matching"))
    if release_series(built) == release_series(running):
        return
    api = f" (XLA FFI API {ffi_api[0]}.{ffi_api[1]})" if ffi_api else ""
    series = "%d.%d" % release_series(built)
    raise ImportError(
        f"dualemb._jax_ffi was built against jaxlib {built}{api}, but this process imports "
        f"jaxlib {running}: its XLA FFI handlers are compiled against the build-time jaxlib's "
        "FFI headers and are only registered with the same jaxlib release series. "
        "To fix it, " + REBUILD_HINT.format(series=series) + ".")


def check_module(ext) -> None:
    """:func:`check_jaxlib` for the loaded extension module against the imported jaxlib."""
    import jaxlib.version

    check_jaxlib(getattr(ext, "jaxlib_version", None), jaxlib.version.__version__,
                 getattr(ext, "ffi_api_version", None))

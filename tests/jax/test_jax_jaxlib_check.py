"""dualemb._jax_ffi records the jaxlib it was compiled against, and its handlers are registered
only with a jaxlib of the same release series: another one fails at import with a message naming
both versions and the fix (dualemb/jax/_jaxlib_check.py)."""

import re
import types
from pathlib import Path

import jax
import jax.ffi
import jaxlib.version
import pytest

import dualemb.jax  # noqa: F401  (the import runs the check against this build)
from dualemb._native import load_extension
from dualemb.jax._jaxlib_check import check_jaxlib, check_module, release_series


def _header_ffi_api():
    """(major, minor) of the imported jaxlib's XLA FFI headers, read from c_api.h."""
    text = (Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "c_api.h").read_text()
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    return int(major.group(1)), int(minor.group(1))


def test_the_built_module_reports_the_imported_jaxlib_and_its_ffi_headers():
    ext = load_extension("_jax_ffi")
    # This test runs against the build it checks, made with the jaxlib imported here.
    assert ext.jaxlib_version == jaxlib.version.__version__
    assert tuple(ext.ffi_api_version) == _header_ffi_api()
    check_module(ext)  # accepted


@pytest.mark.parametrize("built, running", [("0.10.2", "0.11.2"), ("0.12.0", "0.11.2"),
                                            ("0.11.2", "1.11.2")])
def test_another_release_series_is_refused_naming_both_and_the_fix(built, running):
    with pytest.raises(ImportError) as e:
        check_jaxlib(built, running, (0, 3))
    text = str(e.value)
    assert f"built against jaxlib {built} (XLA FFI API 0.3)" in text
    assert f"imports jaxlib {running}" in text
    assert "rebuild dualemb" in text and "pip install --no-build-isolation" in text
    assert "jax/jaxlib %d.%d.*" % release_series(built) in text


def test_a_patch_release_of_the_same_series_is_accepted():
    check_jaxlib("0.11.2", "0.11.0")
    check_jaxlib("0.12.0", "0.12.0.1")
    check_jaxlib("0.12.0.dev20260101", "0.12.1")


def test_a_module_that_does_not_report_its_jaxlib_is_refused():
    # A native module built before it recorded its jaxlib (a stale build).
    with pytest.raises(ImportError, match=r"does not say which jaxlib.*imports jaxlib 0\.11\.2"):
        check_jaxlib(None, "0.11.2")
    stale = types.SimpleNamespace()
    with pytest.raises(ImportError, match="rebuild dualemb"):
        check_module(stale)


def test_the_imported_jaxlib_is_what_check_module_compares_with():
    other = "0.%d.0" % (release_series(jaxlib.version.__version__)[1] + 1)
    fake = types.SimpleNamespace(jaxlib_version=other, ffi_api_version=(0, 9))
    with pytest.raises(ImportError, match=re.escape(
            f"imports jaxlib {jaxlib.version.__version__}")):
        check_module(fake)


def test_an_unreadable_version_raises_value_error():
    with pytest.raises(ValueError, match="cannot read a jaxlib version"):
        release_series("unknown")

"""The version has one source (dualemb/__init__.py): the compiled core, the TF op library and the
XLA FFI module all report the same one, so a mismatched build is visible."""

import dualemb
from dualemb._native import load_extension


def test_core_reports_the_package_version():
    assert load_extension("_core").version() == dualemb.__version__


def test_tf_and_jax_binaries_report_the_package_version():
    import pytest
    ops = pytest.importorskip("dualemb.tf.ops")
    assert ops.build_info()[1] == dualemb.__version__
    pytest.importorskip("jax")
    assert load_extension("_jax_ffi").core_version() == dualemb.__version__

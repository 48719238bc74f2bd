"""Loads the TensorFlow op library ``dualemb/tf/_ops.so`` after checking its TensorFlow version.

A TF custom-op library only works with the exact TensorFlow build it was compiled against, so the
build records that version in ``_ops_tf_version.txt`` beside the library (and compiles it into the
``DualembBuildInfo`` op). On a mismatch, importing ``dualemb.tf`` fails with an ``ImportError``
that names both versions and the command that rebuilds the library, instead of a crash or an
obscure undefined-symbol error.
"""

from __future__ import annotations

import os

import tensorflow as tf

from dualemb._native import native_dir

REBUILD_HINT = (
    "Rebuild dualemb against the installed TensorFlow with the README's install command:\n"
    "    pip install -r requirements-build.txt && "
    "pip install --no-build-isolation -e \".[tf,jax,test,demo]\"\n"
    "(for a development build: tools/dev_build.sh <name> and "
    "DUALEMB_NATIVE_DIR=build/<name>/dualemb)."
)

_OPS = None


def library_dir() -> str:
    """Directory holding ``_ops.so`` and ``_ops_tf_version.txt``."""
    return os.path.join(native_dir(), "tf")


def check_version(built: str, running: str) -> None:
    """Raises ImportError unless the library's TF version equals the running one."""
    if built != running:
        raise ImportError(
            f"dualemb's TensorFlow op library was built against TensorFlow {built}, but "
            f"TensorFlow {running} is imported; a TF op library only runs with the TensorFlow "
            f"it was compiled against. {REBUILD_HINT}")


def load_ops():
    """The loaded op module (generated wrappers such as ``dualemb_find``); loaded once."""
    global _OPS
    if _OPS is not None:
        return _OPS
    directory = library_dir()
    path = os.path.join(directory, "_ops.so")
    version_file = os.path.join(directory, "_ops_tf_version.txt")
    if not os.path.exists(path):
        raise ImportError(f"dualemb's TensorFlow op library is missing ({path}). {REBUILD_HINT}")
    try:
        with open(version_file) as f:
            built = f.read().strip()
    except OSError as e:
        raise ImportError(f"cannot read {version_file} ({e}). {REBUILD_HINT}") from e
    check_version(built, tf.__version__)
    try:
        module = tf.load_op_library(path)
    except (tf.errors.NotFoundError, OSError) as e:
        raise ImportError(f"loading {path} failed: {e}. {REBUILD_HINT}") from e
    compiled, _ = (t.numpy().decode() for t in module.dualemb_build_info())
    check_version(compiled, tf.__version__)
    _OPS = module
    return module

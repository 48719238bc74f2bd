"""The dualemb demo: a DLRM-style model trained across TensorFlow and JAX (docs/demo.md).

Run it with ``python -m dualemb.demo`` or ``dualemb-demo``. Importing this package imports
neither TensorFlow nor JAX; ``main`` loads what the chosen legs need.
"""


def main(argv=None) -> int:
    """Console entry point (``dualemb-demo``); returns the exit status."""
    from dualemb.demo.cli import main as _main

    return _main(argv)


__all__ = ["main"]

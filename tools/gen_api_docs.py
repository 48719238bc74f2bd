"""Writes docs/api/<module>.md from the docstrings of dualemb's public modules.

    python tools/gen_api_docs.py [--out DIR]

Each page lists the module's public names (``__all__`` or names without a leading underscore)
with their signatures and docstrings, classes with their public methods. Run it after changing
a public API; the pages are committed so they can be read without installing anything.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys

MODULES = {
    "core": ["dualemb.core", "dualemb.core.table", "dualemb.core.initializers",
             "dualemb.core.optimizers", "dualemb.core.value_dtypes", "dualemb.core.checkpoint"],
    "tf": ["dualemb.tf", "dualemb.tf.migrate"],
    "jax": ["dualemb.jax", "dualemb.jax.optimizers", "dualemb.jax.initializers",
            "dualemb.jax.nnx", "dualemb.jax.orbax", "dualemb.jax.keras_optax",
            "dualemb.jax.generic"],
}


def public_names(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", "").startswith(module.__name__)]
    return sorted(names)


def signature(obj) -> str:
    try:
        # A default that is a function prints its address, which changes every run.
        return re.sub(r" at 0x[0-9a-f]+>", ">", str(inspect.signature(obj)))
    except (TypeError, ValueError):
        return "(...)"


def describe(name, obj, level=3) -> list[str]:
    doc = inspect.getdoc(obj) or "(no docstring)"
    head = "#" * level
    if inspect.isclass(obj):
        lines = [f"{head} class `{name}{signature(obj)}`", "", doc, ""]
        for mname, member in sorted(vars(obj).items()):
            if mname.startswith("_"):
                continue
            if isinstance(member, property):
                pdoc = inspect.getdoc(member)
                lines += [f"- property `{mname}`: {pdoc.splitlines()[0] if pdoc else ''}"]
            elif callable(member) or isinstance(member, (classmethod, staticmethod)):
                fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                mdoc = inspect.getdoc(fn) or ""
                lines += [f"- `{mname}{signature(fn)}`" + (f": {mdoc}" if mdoc else "")]
        return lines + [""]
    if callable(obj):
        return [f"{head} `{name}{signature(obj)}`", "", doc, ""]
    return []


DOCS_API = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                                         "api"))


def generate(out_dir: str = DOCS_API) -> list[str]:
    """Writes the pages into ``out_dir``; returns the modules skipped (their framework missing).
    tests/repo/test_style.py generates into a temporary directory and compares with docs/api/."""
    skipped = []
    os.makedirs(out_dir, exist_ok=True)
    for page, modules in MODULES.items():
        lines = [f"# API reference: dualemb.{page}", "",
                 "Generated from docstrings by `tools/gen_api_docs.py`; do not edit by hand.", ""]
        for modname in modules:
            try:
                module = importlib.import_module(modname)
            except Exception as e:  # a front end whose framework is missing
                print(f"skipping {modname}: {e}", file=sys.stderr)
                skipped.append(modname)
                continue
            lines += [f"## `{modname}`", "", inspect.getdoc(module) or "", ""]
            for name in public_names(module):
                obj = getattr(module, name, None)
                if inspect.ismodule(obj) or obj is None:
                    continue
                lines += describe(name, obj)
        with open(os.path.join(out_dir, f"{page}.md"), "w") as f:
            f.write("\n".join(lines).rstrip() + "\n")
        print("wrote", os.path.join(out_dir, f"{page}.md"))
    return skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DOCS_API, help="directory of the pages (docs/api)")
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()

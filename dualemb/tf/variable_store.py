"""Where ``de.get_variable`` keeps its variables: TFRA's rules, without TF's private store.

TFRA keeps them in TF's variable-scope store, which belongs to the default graph. So, as there:
- a name is looked up under the current ``tf.compat.v1.variable_scope`` (``scope/name``);
- the store holds its variables (a model function that calls ``get_variable("emb")`` each time it
  runs and keeps nothing gets the same table every time, never a fresh empty one);
- the store is per default graph: ``tf.compat.v1.reset_default_graph()`` (which
  ``tf.test.TestCase`` runs before each test) and a ``with tf.Graph().as_default():`` block start
  an empty one, and the dropped store frees its tables. A ``tf.function`` being traced uses the
  store of the graph it is traced from, so eager code and its functions share variables.
- reusing a name under a scope with ``reuse=False`` in a TF1 graph raises ``ValueError``
  ("Variable scope/name already exists, disallowed"); eagerly (where TF's scopes always
  AUTO_REUSE) and inside a ``tf.function`` the existing variable is returned.

The store is a dict kept in a collection of that graph (public ``get_collection_ref``), so TF
drops it with the graph; nothing of TF's is patched.
"""

from __future__ import annotations

import tensorflow as tf

_COLLECTION = "dualemb_get_variable_store"


def _root_graph() -> tf.Graph:
    """The default graph, or, while tracing a ``tf.function``, the graph it is traced from."""
    graph = tf.compat.v1.get_default_graph()
    while getattr(graph, "outer_graph", None) is not None:  # FuncGraph -> enclosing graph
        graph = graph.outer_graph
    return graph


def _store() -> dict:
    ref = _root_graph().get_collection_ref(_COLLECTION)
    if not ref:
        ref.append({})
    return ref[0]


def full_name(name: str) -> str:
    """``name`` under the current ``tf.compat.v1.variable_scope`` (TFRA's naming)."""
    scope = tf.compat.v1.get_variable_scope().name
    return f"{scope}/{name}" if scope else name


def lookup(name: str):
    """The variable stored under ``name`` (a full name), or None. Raises ValueError where TFRA
    does: the name exists and the current scope says ``reuse=False`` in a TF1 graph."""
    existing = _store().get(name)
    if existing is None:
        return None
    in_tf1_graph = (not tf.executing_eagerly()
                    and not tf.compat.v1.get_default_graph().building_function)
    if in_tf1_graph and tf.compat.v1.get_variable_scope().reuse is False:
        raise ValueError(f"Variable {name} already exists, disallowed. Did you mean to set "
                         "reuse=True or reuse=tf.AUTO_REUSE in VarScope?")
    return existing


def add(name: str, variable) -> None:
    _store()[name] = variable

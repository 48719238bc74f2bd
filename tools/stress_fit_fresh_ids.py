"""Stress loop for issue 24 item 6 ("one id missing after fit"): Keras ``fit`` over fresh ids.

The report's model (Embedding -> Dense(8, relu) -> pooling -> Dense(1), Adagrad, fits of 10 x i
new ids for i = 1..9) on fresh tables, repeated. After every fit it checks, against the ids fed:
the Variable's ``size()``, its exported keys, and the keys of every optimizer slot view
(``SlotVariable.export()`` and ``size()``). Prints one JSON line per run and a summary; exits 1
if any check failed. Too slow for the test suite (tests/tf/test_tf_slot_view_stepped.py holds the
deterministic case):

    DUALEMB_NATIVE_DIR=$PWD/build/dev/dualemb PYTHONPATH=$PWD python tools/stress_fit_fresh_ids.py --runs 10
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The loop itself is the test's (one definition of the report's model and fits).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "tf"))

from test_tf_fit_fresh_ids import fits_over_fresh_ids  # noqa: E402


def one_run(run: int, seq: int, batch: int, dim: int) -> dict:
    failures = []
    fed = set()
    for i, layer, fed in fits_over_fresh_ids(seq, batch, dim, run, f"stress_{run}"):
        keys = layer.params.export()[0].numpy().tolist()
        if int(layer.params.size()) != len(fed):
            failures.append(f"fit {i}: size() {int(layer.params.size())} != {len(fed)} fed")
        if len(keys) != len(set(keys)) or set(keys) != fed:
            failures.append(f"fit {i}: exported keys differ from the ids fed")
        for slot in layer.params.get_slot_variables():
            shown = slot.export()[0].numpy().tolist()
            if set(shown) != fed or int(slot.size()) != len(fed):
                failures.append(f"fit {i}: slot view {slot.name} holds {len(set(shown))} keys, "
                                f"size() {int(slot.size())}, {len(fed)} ids trained")
    return {"run": run, "seq": seq, "batch": batch, "dim": dim, "ids": len(fed),
            "failures": failures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    shapes = [(1, 32, 4), (5, 16, 16), (3, 8, 8)]
    failed = 0
    for run in range(args.runs):
        result = one_run(run, *shapes[run % len(shapes)])
        failed += bool(result["failures"])
        print(json.dumps(result), flush=True)
    print(json.dumps({"runs": args.runs, "failed_runs": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

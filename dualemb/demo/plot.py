"""The loss-curve plot of the demo (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import os

import numpy as np

_FLOOR = 1e-10
_COLORS = {"tf": "#e8710a", "jax": "#1a73e8"}


def _smooth(y: np.ndarray, k: int) -> np.ndarray:
    if k <= 1 or len(y) < k:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = (c[k:] - c[:-k]) / k
    return np.concatenate([y[:k - 1].cumsum() / np.arange(1, k), out])


def plot_losses(path, legs: list, reference: dict, title: str) -> None:
    """Writes a PNG of per-step training losses.

    ``legs``: dicts with ``framework``, ``start`` (first global step) and ``losses``;
    ``reference``: the same for the run that stayed in one framework. Raw losses are drawn
    thin, a moving average thick; the leg boundaries are marked.
    """
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6.4), dpi=110, sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.4]})
    total = max(leg["start"] + len(leg["losses"]) for leg in legs + [reference])
    k = max(1, total // 40)
    ref_y = np.asarray(reference["losses"], np.float64)
    ref_x = reference["start"] + np.arange(len(ref_y))
    # One moving average over the legs' concatenated losses (they are consecutive steps), so
    # that it does not restart at a hand-off.
    smooth_all = _smooth(np.concatenate([np.asarray(leg["losses"], np.float64) for leg in legs]),
                         k)
    offset = 0
    for i, leg in enumerate(legs):
        y = np.asarray(leg["losses"], np.float64)
        x = leg["start"] + np.arange(len(y))
        color = _COLORS.get(leg["framework"], None)
        ax.plot(x, y, color=color, lw=0.6, alpha=0.45)
        ys = smooth_all[offset:offset + len(y)]
        offset += len(y)
        ax.plot(x, ys, color=color, lw=2.4,
                label=f"leg {i + 1}: {leg['framework'].upper()} (steps {x[0]}-{x[-1] + 1})")
        r = ref_y[x - reference["start"]]
        ax2.plot(x, np.maximum(np.abs(y - r), _FLOOR), color=color, lw=1.0)
        if i:
            ax.axvline(leg["start"], color="0.5", lw=0.8, ls=":")
            ax2.axvline(leg["start"], color="0.5", lw=0.8, ls=":")
    ax.plot(ref_x, _smooth(ref_y, k), color="black", lw=1.0, ls="--",
            label=f"reference: stayed in {reference['framework'].upper()} "
                  f"(moving average of {k})")
    ax2.set_yscale("log")
    ax2.set_ylim(_FLOOR / 2, 1.0)
    ax2.set_ylabel("|loss - reference|")
    ax2.text(0.01, 0.04, f"0 (bit-identical) is drawn at {_FLOOR:g}", transform=ax2.transAxes,
             fontsize=7, color="0.4")
    ax2.grid(alpha=0.3)
    ax2.set_xlabel("training step (global)")
    ax.set_ylabel("binary cross-entropy (batch)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = os.fspath(path) + ".tmp.png"
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)

"""PNG plots of a ``scale_grid.py`` result: step time and peak memory against batch size.

* ``step_time_<dtype>.png``: per tp (rows of panels) and vocab (columns), the step's median wall
  time per implementation against the number of requests, quartiles shaded, the measured floor
  dashed; one line style per rows-per-request value.
* ``baseline_time.png`` and ``baseline_memory.png``: replicated against sharded sampling, per tp
  and sampler, time and peak device memory per step against the number of requests (the memory
  plot also draws 1/tp of the replicated peak, thin black).

    python bench/plots.py RESULT.json OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "production": "tab:blue",
    "upstream": "tab:orange",
    "floor": "black",
    "replicated": "tab:red",
    "sharded": "tab:green",
}
STYLES = ["-", "--", ":", "-."]


def _series(rows: list[dict], key, value) -> tuple[list, list]:
    points = sorted((row[key], value(row)) for row in rows if value(row) is not None)
    return [p[0] for p in points], [p[1] for p in points]


def _panels(count_rows: int, count_cols: int):
    fig, axes = plt.subplots(count_rows, count_cols, figsize=(4.2 * count_cols, 3.4 * count_rows), squeeze=False)
    return fig, axes


def step_time_figure(result: dict, dtype: str, path: str) -> None:
    rows = [r for r in result["step"] if r["dtype"] == dtype and "skipped" not in r]
    tps = sorted({r["tp"] for r in rows})
    vocabs = sorted({r["vocab"] for r in rows})
    per_req = sorted({r["rows"] for r in rows})
    fig, axes = _panels(len(tps), len(vocabs))
    for i, tp in enumerate(tps):
        for j, vocab in enumerate(vocabs):
            ax = axes[i][j]
            for k, n in enumerate(per_req):
                sel = [r for r in rows if r["tp"] == tp and r["vocab"] == vocab and r["rows"] == n]
                style = STYLES[k % len(STYLES)]
                for impl in result["implementations"]:
                    x, y = _series(sel, "num_reqs", lambda r, impl=impl: r.get(impl, {}).get("median"))
                    _, lo = _series(sel, "num_reqs", lambda r, impl=impl: r.get(impl, {}).get("q1"))
                    _, hi = _series(sel, "num_reqs", lambda r, impl=impl: r.get(impl, {}).get("q3"))
                    ax.plot(x, y, style, color=COLORS[impl], marker="o", ms=3, label=f"{impl}, {n} row(s)")
                    ax.fill_between(x, lo, hi, color=COLORS[impl], alpha=0.15)
                x, y = _series(sel, "num_reqs", lambda r: r["floor_us"])
                ax.plot(x, y, style, color=COLORS["floor"], lw=1, alpha=0.7, label=f"floor, {n} row(s)")
            ax.set(
                xscale="log",
                yscale="log",
                title=f"tp {tp}, vocab {vocab}, {dtype}",
                xlabel="requests",
                ylabel="step wall us",
            )
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def baseline_figure(result: dict, what: str, path: str) -> None:
    rows = [r for r in result["baseline"] if "skipped" not in r]
    tps = sorted({r["tp"] for r in rows})
    samplers = sorted({r["sampler"] for r in rows})
    per_req = sorted({r["rows"] for r in rows})
    kinds = sorted({(r["vocab"], r["dtype"]) for r in rows})
    fig, axes = _panels(len(tps), len(samplers))
    for i, tp in enumerate(tps):
        for j, sampler in enumerate(samplers):
            ax = axes[i][j]
            for k, (n, kind) in enumerate((n, kind) for n in per_req for kind in kinds):
                sel = [
                    r
                    for r in rows
                    if r["tp"] == tp and r["sampler"] == sampler and r["rows"] == n and (r["vocab"], r["dtype"]) == kind
                ]
                for path_name in ("replicated", "sharded"):
                    if what == "time":
                        x, y = _series(sel, "num_reqs", lambda r, p=path_name: r[p]["median"])
                    else:
                        x, y = _series(sel, "num_reqs", lambda r, p=path_name: r[p]["peak_bytes"] / 1e9)
                    ax.plot(
                        x,
                        y,
                        STYLES[k % len(STYLES)],
                        color=COLORS[path_name],
                        marker="o",
                        ms=3,
                        label=f"{path_name}, {n} row(s), {kind[0]} {kind[1]}",
                    )
                if what == "memory":  # the done-when's bound: 1/tp of the replicated peak
                    x, y = _series(sel, "num_reqs", lambda r, tp=tp: r["replicated"]["peak_bytes"] / tp / 1e9)
                    ax.plot(
                        x, y, STYLES[k % len(STYLES)], color=COLORS["floor"], lw=1, alpha=0.6, label="replicated / tp"
                    )
            ylabel = "step wall us" if what == "time" else "peak GB per step"
            positive = all(y > 0 for line in ax.get_lines() for y in line.get_ydata())
            ax.set(
                xscale="log",
                yscale="log" if positive else "linear",
                title=f"tp {tp}, {sampler}",
                xlabel="requests",
                ylabel=ylabel,
            )  # no device memory counted on the CPU
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(result: dict, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for dtype in sorted({r["dtype"] for r in result.get("step", []) if "skipped" not in r}):
        paths.append(os.path.join(out_dir, f"step_time_{dtype}.png"))
        step_time_figure(result, dtype, paths[-1])
    if any("skipped" not in r for r in result.get("baseline", [])):
        for what in ("time", "memory"):
            paths.append(os.path.join(out_dir, f"baseline_{what}.png"))
            baseline_figure(result, what, paths[-1])
    return paths


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python bench/plots.py RESULT.json OUT_DIR", file=sys.stderr)
        return 2
    with open(argv[0]) as handle:
        result = json.load(handle)
    for path in write_plots(result, argv[1]):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

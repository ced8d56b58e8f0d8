"""The bench report's plots: bars grouped by network profile with bootstrap intervals, acceptance
lengths, disconnection success."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from .records import group_by


@dataclass(frozen=True)
class Bar:
    """One bar of a grouped plot: a system's aggregate on one profile, with its spread."""

    profile: str  # the group on the x axis
    system: str  # the bar's colour within the group
    value: float  # the same aggregate as the report's tables (totals over generations)
    low: float  # 95 % bootstrap interval of that aggregate, resampling generations
    high: float
    n: int  # generations behind it


# Aggregates of the plots as functions of column sums, so a bootstrap resample is one matrix sum.
PLOTTED = {
    "tokens_per_s": (("new_tokens", "wall_s"), lambda t: t["new_tokens"] / t["wall_s"]),
    "calls_per_100_tokens": (("calls", "new_tokens"), lambda t: 100 * t["calls"] / t["new_tokens"]),
    "bytes_per_token": (("bytes_up", "bytes_down", "new_tokens"),
                        lambda t: (t["bytes_up"] + t["bytes_down"]) / t["new_tokens"]),
}


def bars(rows: list[dict], metric: str, resamples: int = 2000, seed: int = 0) -> list[Bar]:
    """Per profile and system: the aggregate and its 95 % bootstrap interval over generations."""
    import numpy as np

    columns, value = PLOTTED[metric]
    rng = np.random.default_rng(seed)  # the same figure from the same results
    out = []
    groups = group_by(rows, "profile", "system")
    profiles = list(dict.fromkeys(profile for profile, _ in groups))  # as the experiment ran them
    for (profile, system), rs in sorted(groups.items(), key=lambda kv: (profiles.index(kv[0][0]), str(kv[0][1]))):
        table = np.array([[float(r.get(c) or 0.0) for c in columns] for r in rs])
        with np.errstate(divide="ignore", invalid="ignore"):
            whole = value(dict(zip(columns, table.sum(axis=0))))
            picks = table[rng.integers(0, len(rs), (resamples, len(rs)))].sum(axis=1)
            spread = np.asarray(value(dict(zip(columns, picks.T))), dtype=float)
        spread = spread[np.isfinite(spread)]
        if not np.isfinite(whole):
            continue  # no tokens or no time: nothing to draw
        low, high = np.percentile(spread, [2.5, 97.5]) if spread.size else (whole, whole)
        out.append(Bar(str(profile), str(system), float(whole), float(min(low, whole)), float(max(high, whole)),
                       len(rs)))
    return out


def grouped_bars(ax, data: list[Bar], ylabel: str) -> None:
    """Profiles along x, one bar per system in each (same colour everywhere), error bars, n on top."""
    profiles = list(dict.fromkeys(b.profile for b in data))
    colours = {s: f"C{i}" for i, s in enumerate(sorted({b.system for b in data}))}
    for p, profile in enumerate(profiles):
        here = [b for b in data if b.profile == profile]  # centred on the profile's tick, whatever is there
        width = 0.8 / max(len(here), 2)
        for i, b in enumerate(here):
            x = p + (i - (len(here) - 1) / 2) * width
            ax.bar(x, b.value, width, color=colours[b.system], label=b.system,
                   yerr=[[b.value - b.low], [b.high - b.value]], capsize=2, error_kw={"elinewidth": 0.8})
            ax.annotate(f"n={b.n}", (x, b.high), xytext=(0, 2), textcoords="offset points", ha="center",
                        fontsize=6)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xticks(range(len(profiles)), profiles)
    ax.set_xlabel("network profile")
    ax.set_ylabel(ylabel)


def draw_plots(out: Path, data: dict[str, list[dict]]) -> list[str]:
    """The report's PNG plots of the experiments in `data`, written into `out`; their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)

    def bar(name: str, title: str, ylabel: str, rows: list[dict], metric: str) -> None:
        data = bars(rows, metric)
        if not data:
            return
        groups = len({b.profile for b in data})
        fig, ax = plt.subplots(figsize=(max(6, groups * 1.6), 3.8))
        grouped_bars(ax, data, ylabel)
        ax.set_title(f"{title}\n(bars: 95 % bootstrap interval over generations; n = generations)", fontsize=9)
        save(fig, name)

    gen = data.get("link", []) + data.get("speed", [])
    if gen:
        bar("tokens_per_s.png", "tokens/s by profile and system", "tokens/s", gen, "tokens_per_s")
        bar("calls_per_100_tokens.png", "calls to the server per 100 tokens", "calls", gen, "calls_per_100_tokens")
        bar("bytes_per_token.png", "bytes per token (up + down)", "bytes", gen, "bytes_per_token")
        taus = defaultdict(list)
        for r in gen:
            if r.get("num_drafts"):
                taus[r["system"]].append(r["acceptance_length"])
        if taus:
            fig, ax = plt.subplots(figsize=(6, 3.5))
            for system, values in sorted(taus.items()):
                ax.hist(values, bins=20, alpha=0.6, label=system)
            ax.set_xlabel("acceptance length per generation")
            ax.set_ylabel("generations")
            ax.legend()
            save(fig, "acceptance_length.png")
    if data.get("disconnect"):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for (drafter,), rs in sorted(group_by(data["disconnect"], "system").items()):
            if drafter == "target":
                ax.axhline(sum(r["passed"] for r in rs) / len(rs), color="grey", ls=":", label="target alone")
                continue
            by_cut = group_by(rs, "cut_after")
            keys = sorted(k for k in by_cut if k != (None,)) + ([(None,)] if (None,) in by_cut else [])  # never last
            xs = ["never" if c is None else str(c) for (c,) in keys]
            ax.plot(xs, [sum(r["passed"] for r in by_cut[k]) / len(by_cut[k]) for k in keys], marker="o", label=drafter)
            ax.plot(xs, [sum(r["passed_stop_at_cut"] for r in by_cut[k]) / len(by_cut[k]) for k in keys],
                    ls="--", marker="x", label=f"{drafter}: stop at the cut")
        ax.set_xlabel("link cut after B new tokens")
        ax.set_ylabel("HumanEval pass@1")
        ax.legend(fontsize=7)
        save(fig, "disconnect_success.png")
    return made

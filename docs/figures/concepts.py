"""Draw docs/assets/concepts.png: two rounds of speculative decoding (draft, verification, round).

    python docs/figures/concepts.py            # writes docs/assets/concepts.png

Round 1: the length policy asks for 3 tokens, the drafter proposes them, the target verifies the
draft in one forward pass and accepts 2; the first rejected token is replaced by the target's
correction token. Round 2: the policy asks for 4, all are accepted, and the target adds its bonus
token. Deterministic: no data, no randomness.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "assets" / "concepts.png"
COLOURS = {
    "committed": "#d9d9d9",
    "accepted": "#8fd18f",
    "rejected": "#f2a3a3",
    "target": "#8fb8f2",
    "unverified": "#ffffff",
}


def box(ax, x, y, text, kind, width=0.9, height=0.8, struck=False):
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            width,
            height,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            facecolor=COLOURS[kind],
            edgecolor="#333333",
            linewidth=1.0,
        )
    )
    ax.text(x + width / 2, y + height / 2, text, ha="center", va="center", fontsize=10, family="monospace")
    if struck:
        ax.plot([x + 0.12, x + width - 0.12], [y + height / 2, y + height / 2], color="#a00000", linewidth=1.6)


def arrow(ax, start, end, text="", offset=(0.0, 0.0)):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="#333333", linewidth=1.0))
    if text:
        ax.text(
            (start[0] + end[0]) / 2 + offset[0],
            (start[1] + end[1]) / 2 + offset[1],
            text,
            fontsize=9,
            ha="left",
            va="center",
            color="#333333",
        )


def round_panel(ax, x0, y0, title, committed, draft, accepted, extra, extra_kind, policy_text):
    """One round: committed prefix, the draft (drafter), the verdict (target), what is committed after."""
    ax.text(x0, y0 + 7.55, title, fontsize=12, fontweight="bold")
    ax.text(x0, y0 + 6.95, policy_text, fontsize=9, color="#333333")
    # the drafter's proposal
    ax.text(x0, y0 + 6.2, "draft (drafter, k tokens)", fontsize=9, color="#555555")
    for i, tok in enumerate(committed):
        box(ax, x0 + i, y0 + 5.2, tok, "committed")
    start = x0 + len(committed)
    for i, tok in enumerate(draft):
        box(ax, start + i, y0 + 5.2, tok, "unverified")
    # verification: one target pass over the whole draft
    middle = start + len(draft) / 2
    arrow(ax, (middle, y0 + 5.1), (middle, y0 + 3.95), "verify: ONE target pass", (0.15, 0))
    ax.text(x0, y0 + 3.55, "verification (target)", fontsize=9, color="#555555")
    for i, tok in enumerate(committed):
        box(ax, x0 + i, y0 + 2.55, tok, "committed")
    for i, tok in enumerate(draft):
        ok = i < accepted
        box(ax, start + i, y0 + 2.55, tok, "accepted" if ok else "rejected", struck=not ok)
    # the correction or bonus token
    pos = start + accepted if accepted < len(draft) else start + len(draft)
    box(ax, pos, y0 + 1.55, extra, extra_kind)
    label = (
        "correction token (replaces the first rejected one)"
        if extra_kind == "target" and accepted < len(draft)
        else "bonus token (every draft token accepted)"
    )
    ax.text(x0, y0 + 0.95, label, fontsize=9, color="#1f4e99")
    ax.text(
        x0,
        y0 + 0.45,
        f"speculation length k = {len(draft)}, accepted length a = {accepted}, "
        f"round emits a + 1 = {accepted + 1} tokens",
        fontsize=9,
    )


def main() -> Path:
    fig, ax = plt.subplots(figsize=(8.6, 9.4), dpi=120)
    ax.set_xlim(-0.2, 10.2)
    ax.set_ylim(-0.6, 16.3)
    ax.axis("off")
    round_panel(
        ax,
        0.0,
        8.2,
        "round 1",
        ["She", "has"],
        ["3", "red", "eggs"],
        2,
        "apples",
        "target",
        "length policy: next_length(draft) -> 3, then 0",
    )
    round_panel(
        ax,
        0.0,
        0.0,
        "round 2",
        ["has", "3", "red", "apples"],
        [".", "She", "eats", "2"],
        4,
        "of",
        "target",
        "length policy: 2, then 2, then 0 (the draft grew to k = 4)",
    )
    ax.plot([-0.1, 10.1], [8.05, 8.05], color="#999999", linewidth=0.8, linestyle="--")
    handles = [
        plt.Rectangle((0, 0), 1, 1, facecolor=COLOURS[k], edgecolor="#333333")
        for k in ("committed", "unverified", "accepted", "rejected", "target")
    ]
    ax.legend(
        handles,
        [
            "committed (earlier rounds)",
            "drafted, not yet verified",
            "accepted by the target",
            "rejected (discarded)",
            "the target's own token",
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.03),
        ncol=3,
        frameon=False,
        fontsize=9,
    )
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, bbox_inches="tight")
    plt.close(fig)
    return OUT


if __name__ == "__main__":
    print(main())

#!/usr/bin/env python3
"""Medians of scripts/bench-everyday.sh's results, as a Markdown table.

    everyday-summary.py RESULTS.tsv SYSTEM...

One row per step and a total (the median of each round's sum), one column per
system in the order given, then each system's total as a ratio to the first
system's and, where both ran, braid's ratio to MooseFS and to the FUSE passthrough.
"""
import statistics
import sys
from collections import defaultdict

STEPS = ["extract", "find", "du", "cp-a", "read-all", "rm-rf"]


def main():
    path, systems = sys.argv[1], sys.argv[2:]
    times = defaultdict(list)  # (system, step) -> seconds per round
    rounds = defaultdict(lambda: defaultdict(float))  # system -> round -> total
    for line in open(path):
        sys_, r, step, secs = line.split("\t")
        times[(sys_, step)].append(float(secs))
        rounds[sys_][r] += float(secs)
    systems = [s for s in systems if rounds[s]]
    med = {(s, st): statistics.median(times[(s, st)]) for s in systems for st in STEPS if times[(s, st)]}
    total = {s: statistics.median(rounds[s].values()) for s in systems}
    n = min(len(rounds[s]) for s in systems)
    print(f"medians of {n} rounds, seconds\n")
    print("| step | " + " | ".join(systems) + " |")
    print("|---|" + "---:|" * len(systems))
    for st in STEPS:
        print(f"| {st} | " + " | ".join(f"{med.get((s, st), float('nan')):.2f}" for s in systems) + " |")
    base = systems[0]
    print("| total | " + " | ".join(f"{total[s]:.2f} ({total[s] / total[base]:.1f}x)" for s in systems) + " |")
    for braid in [s for s in systems if s.startswith("braid")]:
        for peer in ("moosefs", "bindfs"):
            if peer not in total:
                continue
            steps = ", ".join(f"{st} {med[(peer, st)] / med[(braid, st)]:.1f}x" for st in STEPS if (braid, st) in med)
            print(f"\n{peer} / {braid}: total {total[peer] / total[braid]:.2f}x; per step: {steps}")


if __name__ == "__main__":
    main()

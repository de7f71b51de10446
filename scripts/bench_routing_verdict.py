#!/usr/bin/env python3
"""The routing benchmark's verdict: given the results files of round-robin, least-loaded, prefix-aware-v1 and
prefix-aware (in that order) over the same rate sweep, print each level's TTFT p50/p90/p99, throughput and goodput
side by side, then the figures at the first rate where round-robin's p90 TTFT exceeds the target (issue 42's
"Done when": p90 at least 3x better than round-robin's and 1.5x better than v1's, p50 at least 5x better than
round-robin's, no level below v1's throughput).

Usage: scripts/bench_routing_verdict.py RR.json LL.json V1.json NEW.json [--target-s 2]
"""
import json
import sys


def levels(path):
    r = json.load(open(path))
    return r["label"], {round(l["shape"].get("rate", l["shape"].get("speed", l["shape"].get("clients", 0))), 6): l["summary"] for l in r["levels"]}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    target = 2.0
    if "--target-s" in sys.argv:
        target = float(sys.argv[sys.argv.index("--target-s") + 1])
    if len(args) != 4:
        sys.exit(__doc__)
    runs = [levels(p) for p in args]
    names = [n for n, _ in runs]
    rates = sorted(set.intersection(*[set(l) for _, l in runs]))
    print(f"{'load':>6}  {'policy':<16} {'ok':>4} {'TTFT p50':>9} {'p90':>8} {'p99':>8} {'out tok/s':>9} {'goodput':>8}")
    for rate in rates:
        for name, ls in runs:
            s = ls[rate]
            t = s["ttft"]
            good = s.get("goodput") or {}
            share = f"{100 * good['share']:.0f}%" if "share" in good else "-"
            print(f"{rate:>6}  {name:<16} {s['ok']:>4} {t['p50']:>8.3f}s {t['p90']:>7.3f}s {t['p99']:>7.3f}s "
                  f"{s['output_tokens_per_s']:>9.1f} {share:>8}")
    rr, _, v1, new = [l for _, l in runs]
    at = next((r for r in rates if rr[r]["ttft"]["p90"] > target), None)
    print()
    if at is None:
        print(f"round-robin's p90 TTFT never exceeded {target} s: no verdict (raise the rates)")
        return
    ratio = lambda a, b, q: a[at]["ttft"][q] / max(b[at]["ttft"][q], 1e-9)
    p90_rr, p90_v1, p50_rr = ratio(rr, new, "p90"), ratio(v1, new, "p90"), ratio(rr, new, "p50")
    thr = [new[r]["output_tokens_per_s"] / max(v1[r]["output_tokens_per_s"], 1e-9) for r in rates]
    print(f"at {at} (round-robin's p90 TTFT first over {target} s): {names[3]} p90 {p90_rr:.1f}x better than "
          f"{names[0]}, {p90_v1:.2f}x better than {names[2]}; p50 {p50_rr:.1f}x better than {names[0]}")
    print(f"throughput {names[3]} / {names[2]} per level: " + ", ".join(f"{t:.2f}" for t in thr))
    checks = [("p90 >= 3x round-robin", p90_rr >= 3), ("p90 >= 1.5x v1", p90_v1 >= 1.5),
              ("p50 >= 5x round-robin", p50_rr >= 5), ("no level below v1's throughput (0.97)", min(thr) >= 0.97)]
    print("; ".join(f"{c}: {'yes' if ok else 'NO'}" for c, ok in checks))
    # Where the old prefix-aware cost saturates: the load at which counting queued work matters.
    knee = next((r for r in rates if v1[r]["ttft"]["p90"] > target), None)
    if knee is not None:
        v = lambda q: v1[knee]["ttft"][q] / max(new[knee]["ttft"][q], 1e-9)
        print(f"at {knee} ({names[2]}'s p90 TTFT first over {target} s): {names[3]} p50 {v('p50'):.2f}x, "
              f"p90 {v('p90'):.2f}x, p99 {v('p99'):.2f}x better than {names[2]}")
    else:
        print(f"{names[2]}'s p90 TTFT stayed within {target} s at every load")


if __name__ == "__main__":
    main()

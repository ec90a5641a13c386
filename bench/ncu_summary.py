"""Per-kernel totals of an `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,
dram__bytes_write.sum` log: launches, time, share of the kernel time, and DRAM bytes over time.

    python3 bench/ncu_summary.py ncu.csv
"""

import collections
import csv
import sys

SCALE = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "nsecond": 1e-9, "usecond": 1e-6,
         "msecond": 1e-3, "second": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def main():
    rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
    if not rows:
        print("ncu: no kernel rows")
        return
    head, rows = rows[0], rows[1:]
    ki, mi, vi, ui = (head.index(c) for c in
                      ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows:
        name = r[ki].split("(")[0][:70]
        v = float(r[vi].replace(",", "")) * SCALE.get(r[ui], 1.0)
        if r[mi] == "gpu__time_duration.sum":
            agg[name][0] += 1
            agg[name][1] += v
        else:
            agg[name][2] += v
    total = sum(a[1] for a in agg.values())
    print(f"ncu: {sum(a[0] for a in agg.values())} kernels, {total * 1e3:.3f} ms of kernel time")
    print("| kernel | launches | ms | share | DRAM GB/s (r+w) |")
    print("|---|---|---|---|---|")
    for name, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:14]:
        gbs = b / t / 1e9 if t else 0.0
        print(f"| {name} | {n} | {t * 1e3:.3f} | {100 * t / total:.1f}% | {gbs:.0f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Chart of a `ferry bench --sweep`: throughput and latency against block size.

Usage: plot_sweep.py SWEEP.csv CHART.png

Reads the CSV that `ferry bench --sweep` writes (one row per threads x block
size) and draws two panels: throughput (GB/s, 1e9 bytes) with the plain-TCP
baselines as horizontal lines, and per-batch / per-request latency p50 and p99.
Needs matplotlib (Debian: python3-matplotlib, run with /usr/bin/python3).
"""
import csv
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def num(text):
    try:
        v = float(text)
    except (TypeError, ValueError):
        return math.nan
    return v


def size_label(b):
    b = int(b)
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"{argv[1]}: no rows", file=sys.stderr)
        return 1
    by_threads = {}
    for r in rows:
        by_threads.setdefault(int(r["threads"]), []).append(r)

    fig, (ax_tp, ax_lat) = plt.subplots(1, 2, figsize=(12, 4.8))
    blocks = sorted({int(r["block_size"]) for r in rows})
    for threads, rs in sorted(by_threads.items()):
        rs.sort(key=lambda r: int(r["block_size"]))
        x = [int(r["block_size"]) for r in rs]
        label = f"Ferry, {threads} thread{'s' if threads > 1 else ''}"
        ax_tp.plot(x, [num(r["throughput_gbps"]) for r in rs], marker="o", label=label)
        line, = ax_lat.plot(x, [num(r["batch_p50_us"]) for r in rs], marker="o",
                            label=f"batch p50, {threads} thr")
        ax_lat.plot(x, [num(r["batch_p99_us"]) for r in rs], marker="x", linestyle="--",
                    color=line.get_color(), label=f"batch p99, {threads} thr")
        ax_lat.plot(x, [num(r["request_p50_us"]) for r in rs], marker="s", linestyle=":",
                    color=line.get_color(), label=f"request p50, {threads} thr")

    first = rows[0]
    for key, label, style in (("socket_gbps", "plain TCP, multi-stream", "-."),
                              ("socket_single_gbps", "plain TCP, 1 stream", ":")):
        v = num(first.get(key))
        if not math.isnan(v):
            ax_tp.axhline(v, color="grey", linestyle=style, label=f"{label} ({v:.2f})")
    rtt = num(first.get("socket_rtt_us"))
    if not math.isnan(rtt):
        ax_lat.axhline(rtt, color="grey", linestyle=":", label=f"plain busy-poll RTT ({rtt:.1f} µs)")

    for ax in (ax_tp, ax_lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(blocks)
        ax.set_xticklabels([size_label(b) for b in blocks], rotation=30)
        ax.set_xlabel("block size")
        ax.grid(True, which="both", alpha=0.3)
    ax_tp.set_ylabel("throughput (GB/s, 1e9 B)")
    ax_tp.set_ylim(bottom=0)
    ax_tp.set_title("Throughput")
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("latency (µs)")
    ax_lat.set_title("Latency")
    ax_tp.legend(fontsize=8)
    ax_lat.legend(fontsize=7)
    transports = sorted({r.get("transport") or "?" for r in rows})
    fig.suptitle(f"ferry bench --sweep (transport {', '.join(transports)})")
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

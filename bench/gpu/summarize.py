#!/usr/bin/env python3
"""The table of bench/gpu/run.sh: per shape, SDPA's time and each kernel's time, speed-up over SDPA and fraction
of the copy bandwidth on its own (compressed) bytes; the hot (L2-resident) times against the cold ones (hot.jsonl); the
exact path of the int keys against their default integer path (exact.jsonl); then the append kernels per codec
(append.jsonl). Reads sdpa.jsonl, kvq.jsonl, hot.jsonl, exact.jsonl and append.jsonl where present; writes
summary.json."""
import json
import sys

out_dir = sys.argv[1]
sdpa = {(r["batch"], r["ctx"]): r for r in map(json.loads, open(f"{out_dir}/sdpa.jsonl"))}
kvq = [json.loads(line) for line in open(f"{out_dir}/kvq.jsonl") if line.startswith("{")]
summary = []
for res in kvq:
    for r in res["rows"]:
        base = sdpa.get((r["batch"], r["ctx"]))
        r["sdpa_us"] = base["us_per_call"] if base else None
        r["speedup_vs_sdpa"] = base["us_per_call"] / r["us_per_call"] if base else None
        r["copy_gbps"] = res["copy_gbps"]
        summary.append(r)


def bench_rows(name):
    """The rows of every `kvq bench --json` line in out_dir/name (none where the file is missing)."""
    rows = []
    try:
        for line in open(f"{out_dir}/{name}"):
            if line.startswith("{"):
                rows.extend(json.loads(line)["rows"])
    except FileNotFoundError:
        pass
    return rows


hot = bench_rows("hot.jsonl")
exact = bench_rows("exact.jsonl")
appends = []
try:
    for line in open(f"{out_dir}/append.jsonl"):
        if line.startswith("{"):
            res = json.loads(line)
            for r in res["rows"]:
                r["copy_gbps"] = res["copy_gbps"]
                appends.append(r)
except FileNotFoundError:
    pass
json.dump({"sdpa": list(sdpa.values()), "rows": summary, "hot": hot, "exact": exact, "append": appends}, open(f"{out_dir}/summary.json", "w"),
          indent=1)
print(f"{'batch':>5} {'ctx':>7} {'pair':<24} {'us':>9} {'sdpa us':>9} {'vs sdpa':>8} {'GB/s':>7} {'of copy':>7}")
for r in summary:
    pair = r["k"] + "/" + r["v"]
    vs = f"{r['speedup_vs_sdpa']:.2f}x" if r["speedup_vs_sdpa"] else "-"
    sd = f"{r['sdpa_us']:.1f}" if r["sdpa_us"] else "-"
    print(f"{r['batch']:>5} {r['ctx']:>7} {pair:<24} {r['us_per_call']:>9.1f} {sd:>9} {vs:>8} {r['gbps']:>7.0f} "
          f"{r['bw_fraction']:>7.2f}")
cold = {(r["k"], r["v"], r["batch"], r["ctx"]): r for r in summary}
if hot:
    print(f"\n{'hot':<5} {'ctx':>7} {'pair':<24} {'hot us':>9} {'cold us':>9} {'cold/hot':>8}")
    for r in hot:
        c = cold.get((r["k"], r["v"], r["batch"], r["ctx"]))
        ratio = f"{c['us_per_call'] / r['us_per_call']:.2f}" if c else "-"
        cus = f"{c['us_per_call']:.1f}" if c else "-"
        print(f"{r['batch']:>5} {r['ctx']:>7} {r['k'] + '/' + r['v']:<24} {r['us_per_call']:>9.1f} {cus:>9} {ratio:>8}")
if exact:
    print(f"\n{'exact':<5} {'ctx':>7} {'pair':<24} {'exact us':>9} {'default':>9} {'exact/def':>9} default kernel")
    for r in exact:
        c = cold.get((r["k"], r["v"], r["batch"], r["ctx"]))
        ratio = f"{r['us_per_call'] / c['us_per_call']:.2f}" if c else "-"
        cus = f"{c['us_per_call']:.1f}" if c else "-"
        print(f"{r['batch']:>5} {r['ctx']:>7} {r['k'] + '/' + r['v']:<24} {r['us_per_call']:>9.1f} {cus:>9} {ratio:>9} "
              f"{c.get('kernel', '-') if c else '-'}")
if appends:
    print(f"\n{'append':<15} {'codec':<14} {'batch':>5} {'tokens':>8} {'us':>9} {'Mtok/s':>8} {'GB/s':>7} "
          f"{'of copy':>7}")
    for r in appends:
        print(f"{r['mode']:<15} {r['codec']:<14} {r['batch']:>5} {r['tokens_per_call']:>8.0f} {r['us_per_call']:>9.1f} "
              f"{r['tokens_per_s'] / 1e6:>8.2f} {r['gbps']:>7.0f} {r['bw_fraction']:>7.2f}")

"""Prints run_e2e.sh's results as Markdown tables (docs/performance.md's).

Usage: python3 e2e_summary.py OUT_DIR
Reads the pagealloc-bench JSON files run_e2e.sh wrote in OUT_DIR (one per
step: decode256.json, mix.json, sglang_decode_ps*_b*.json,
sglang_prefill_ps*.json, decode256_grpc.json, mix_grpc.json,
variant*_round*.json with variants.txt) and the seed's anchor
(anchor_unsynced.json); a missing file leaves its rows out.

Modes (bench/README.md): sync (the call waits for the launch), async (the
call returns once the launch is queued; the host copies the slots after
the completion), gpu (GPU-ordered: the call returns once the launch is
queued and is timed until the client's stream is ordered after it; the
slots are read by a kernel on that stream).
"""
import json
import os
import re
import sys

MODE_NAMES = {"sync": "sync", "async": "async, slots copied to the host",
              "gpu": "GPU-ordered", "sync_gpu": "sync, slots read on the GPU"}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def us(value):
    return f"{value:.1f}" if value is not None and value >= 0 else "-"


def rate(value):
    return f"{value:,.0f}"


def phases_by(r, mode):
    """{clients: phase} of run r's phases in `mode`."""
    if r is None:
        return {}
    return {p["clients"]: p for p in r["phases"]
            if p.get("mode", "async" if p["async_completion"] else "sync")
            == mode}


def anchor_rows(out):
    """{(page_size, bs): row} of the seed's unsynced alloc_decode."""
    rows = load(os.path.join(out, "anchor_unsynced.json")) or []
    return {(row["page_size"], row["bs"]): row for row in rows}


def floors_text(r):
    f = r["floors"]
    enqueue = f.get("in_process_enqueue", {}).get("p50_us")
    return (us(f["health_check"]["p50_us"]),
            us(f["in_process_decode"]["p50_us"]), us(enqueue))


def decode_table(out, anchors):
    print("AllocDecode(256), page size 16, one client, decode steps only "
          "(us; calls/s is the client's allocation calls):\n")
    print("| path, mode | p50 | p90 | p99 | p99.9 | calls/s | empty gRPC p50 "
          "| in-process p50: complete / enqueued | p50 / empty "
          "| daemon CPU per call |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path, file in (("fast channel", "decode256.json"),
                       ("gRPC", "decode256_grpc.json")):
        r = load(os.path.join(out, file))
        if r is None or not r["phases"]:
            print(f"| {path} | (no results) | | | | | | | | |")
            continue
        health, complete, enqueue = floors_text(r)
        for p in r["phases"]:
            d = p["rpcs"]["AllocDecode"]
            mode = MODE_NAMES.get(p.get("mode"), p.get("mode", "sync"))
            ratio = d["p50_us"] / r["floors"]["health_check"]["p50_us"]
            print(f"| {path}, {mode} | {us(d['p50_us'])} | {us(d['p90_us'])} "
                  f"| {us(d['p99_us'])} | {us(d['p999_us'])} "
                  f"| {rate(p['alloc_calls_per_s'])} | {health} "
                  f"| {complete} / {enqueue} | {ratio:.2f}x "
                  f"| {us(p['server_cpu_us_per_alloc_call'])} |")
    seed = anchors.get((16, 256))
    if seed:
        print(f"| the seed's in-process alloc_decode, no device sync "
              f"| {us(seed['host_call_p50_us'])} | | "
              f"{us(seed['host_call_p99_us'])} | | | | | | |")
    print()


def sweep_table(title, r, rpc, modes, extra_note=""):
    """One row per client count, the modes side by side."""
    if r is None:
        return
    by_mode = {m: phases_by(r, m) for m in modes}
    clients = sorted({c for m in modes for c in by_mode[m]})
    if not clients:
        return
    health, complete, enqueue = floors_text(r)
    print(f"{title} (floors in this run: empty gRPC p50 {health} us, "
          f"in-process decode({r['config']['batch']}) p50 {complete} us "
          f"complete, {enqueue} us enqueued){extra_note}:\n")
    head = ["clients"]
    for m in modes:
        name = MODE_NAMES.get(m, m)
        head += [f"{name}: alloc calls/s", "calls/launch",
                 f"{rpc} p50 / p99 us", "daemon CPU per call us"]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for c in clients:
        row = [str(c)]
        for m in modes:
            p = by_mode[m].get(c)
            if p is None:
                row += ["-"] * 4
                continue
            d = p["rpcs"][rpc]
            row += [rate(p["alloc_calls_per_s"]), f"{p['calls_per_launch']:.2f}",
                    f"{us(d['p50_us'])} / {us(d['p99_us'])}",
                    us(p["server_cpu_us_per_alloc_call"])]
        print("| " + " | ".join(row) + " |")
    print()


def sglang_tables(out, anchors):
    # First the one-client figures beside the floors and the seed.
    runs = []
    for ps in (1, 16):
        for bs in (256, 1024):
            r = load(os.path.join(out, f"sglang_decode_ps{ps}_b{bs}.json"))
            if r is not None:
                runs.append((ps, bs, r))
    if runs:
        print("SGLang-shaped decode, one client, decode steps only (us): "
              "GPU-ordered call (returned, the client's stream ordered "
              "after it) against the floors and SGLang's own in-process "
              "call without a device sync:\n")
        print("| page size | requests | sync p50 / p99 | GPU-ordered p50 / p99 "
              "| in-process: complete / enqueued p50 | seed, no sync: p50 / "
              "p99 | GPU-ordered p50 / seed p50 |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for ps, bs, r in runs:
            sync = phases_by(r, "sync").get(1)
            gpu = phases_by(r, "gpu").get(1)
            _, complete, enqueue = floors_text(r)
            seed = anchors.get((ps, bs))

            def pair(p):
                if p is None:
                    return "-"
                d = p["rpcs"]["AllocDecode"]
                return f"{us(d['p50_us'])} / {us(d['p99_us'])}"

            seed_text = (f"{us(seed['host_call_p50_us'])} / "
                         f"{us(seed['host_call_p99_us'])}" if seed else "-")
            ratio = "-"
            if seed and gpu:
                ratio = gpu["rpcs"]["AllocDecode"]["p50_us"] / \
                    seed["host_call_p50_us"]
                ratio = f"{ratio:.2f}x"
            print(f"| {ps} | {bs} | {pair(sync)} | {pair(gpu)} "
                  f"| {complete} / {enqueue} | {seed_text} | {ratio} |")
        print()
    for ps, bs, r in runs:
        sweep_table(f"SGLang-shaped decode, page size {ps}, {bs} requests "
                    f"per call, 1..16 clients", r, "AllocDecode",
                    ("sync", "gpu"))
    for ps in (1, 16):
        r = load(os.path.join(out, f"sglang_prefill_ps{ps}.json"))
        if r is None:
            continue
        slots = ""
        p = phases_by(r, "gpu").get(1) or phases_by(r, "sync").get(1)
        if p and p["rpcs"]["AllocExtend"]["count"]:
            e = p["rpcs"]["AllocExtend"]
            slots = f"; {e['slots'] / e['count']:,.0f} slots per chunk call"
        sweep_table(f"Prefill chunks, page size {ps}: 8 sequences extended "
                    f"by up to 2048 tokens per call, 1..16 clients", r,
                    "AllocExtend", ("sync", "gpu"), slots)


def variant_table(out):
    names = {}
    try:
        with open(os.path.join(out, "variants.txt")) as f:
            for line in f:
                index, _, flags = line.rstrip("\n").partition(" ")
                names[int(index)] = flags
    except OSError:
        return
    runs = []
    for file in os.listdir(out):
        m = re.fullmatch(r"variant(\d+)_round(\d+)\.json", file)
        r = m and load(os.path.join(out, file))
        if r and r["phases"]:
            runs.append((int(m.group(2)), int(m.group(1)), r["phases"][0]))
    print("8 clients, default mix, fast channel, by daemon/bench flags:\n")
    print("| round: flags | alloc calls/s | calls/launch "
          "| AllocDecode p50 / p99 us | daemon CPU per call us |")
    print("| --- | --- | --- | --- | --- |")
    for round_, index, p in sorted(runs):
        d = p["rpcs"]["AllocDecode"]
        print(f"| {round_}: {names.get(index, index)} "
              f"| {rate(p['alloc_calls_per_s'])} "
              f"| {p['calls_per_launch']:.2f} "
              f"| {us(d['p50_us'])} / {us(d['p99_us'])} "
              f"| {us(p['server_cpu_us_per_alloc_call'])} |")
    print()


def main():
    out = sys.argv[1]
    anchors = anchor_rows(out)
    decode_table(out, anchors)
    sweep_table("Default mix, page size 16, 256 sequences per client, "
                "fast channel", load(os.path.join(out, "mix.json")),
                "AllocDecode", ("sync", "gpu"))
    sweep_table("Default mix through gRPC",
                load(os.path.join(out, "mix_grpc.json")), "AllocDecode",
                ("sync",))
    sglang_tables(out, anchors)
    variant_table(out)


if __name__ == "__main__":
    main()

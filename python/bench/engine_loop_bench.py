#!/usr/bin/python3
"""A scheduler's decode loop with each allocator, in 1..N scheduler
processes on one GPU: what an engine pays per step for its KV allocation.

    engine_loop_bench.py --allocators none,sglang,pagealloc \\
        --target unix:///run/pagealloc/gpu0.sock --processes 1,2,4 \\
        [--seed_kernels DIR] [--mode alloc|decode] [--steps 400] \\
        [--rounds 5] [--json OUT]

Every step of every process does what a scheduler's decode step does:

  1. plans on the host which requests start a new page this step,
  2. allocates: `alloc(need_size)` of whole pages (SGLang's current path,
     --mode alloc) or `alloc_decode(seq_lens, seq_lens_cpu, last_loc)`
     (the legacy path, --mode decode),
  3. writes one token's KV at the step's slots (an index_put into a KV
     tensor of the scheduler's own),
  4. runs a model-sized GPU step: bf16 matmuls in the scheduler's own CUDA
     context, sized to --model_ms (about 5 ms),
  5. synchronizes the host with the device once,
  6. retires requests that reached their length (`free` of their slots,
     a device tensor, as SGLang frees req_to_token rows once the step's
     results are on the host) and admits new ones (`alloc` of their
     prompt's pages).

Allocators:
  none       the same loop with slots precomputed and no allocation: the
             baseline each allocator's cost is measured over
  sglang     SGLang's in-process path restated: a device tensor of free
             pages sliced by alloc(n), frees concatenated back; decode mode
             launches the seed's Triton alloc_decode_kernel (--seed_kernels,
             the folder that holds seed_triton_kernels.py). Each process
             has a pool of its own (the daemon's pool split evenly).
  pagealloc  pagealloc.sglang's allocator on the daemon at --target (the
             session page reserve by default; every process shares the pool)
  pagealloc-copy  the reserve without its device mirror (mirror_pages=0):
             each alloc copies its slots to the device
  pagealloc-thin  the same with the reserve off: every call a round trip

Reports per allocator and process count: step time p50/p99 (ms), the
allocation's host time per step (the allocator's calls: alloc and free)
p50/p99 (us), cost per step over `none` (p50 step difference, us), and for
the pagealloc allocators the round trips per step and pages per refill
(from the reserve's counters). The step's cost over `none` moves by
hundreds of microseconds from one run of the loop to the next (the GPU's
clocks, the host's scheduling), more than the allocators differ: with
--rounds R every allocator runs R times, the allocators in turn within each
round, each round's cost over that round's `none`, and a second table gives
per allocator the median over the rounds and their range. Run it with and without MPS
(nvidia-cuda-mps-control -d) for the MPS rows; the row records which.

On a machine without CUDA it runs the same loop on the CPU (a smaller
model step) against a CPU-backend daemon: a check that it works, not a
figure.
"""

import argparse
import json
import multiprocessing
import os
import queue
import sys
import time

import numpy as np
import torch


def percentile(values, q):
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


class SGLangFreeList:
    """SGLang's paged allocator in one process, restated: a device tensor of
    free page ids; alloc(n) slices whole pages off its front, free puts the
    freed pages at its end (its unsorted free path). At page size 1 its
    token allocator: alloc(n) is the slice itself, free appends the slots
    as given."""

    def __init__(self, first_page, num_pages, page_size, device):
        self.page_size = page_size
        self.device = device
        self.free_pages = torch.arange(first_page, first_page + num_pages,
                                       dtype=torch.int64, device=device)
        self.offsets = torch.arange(page_size, dtype=torch.int64,
                                    device=device)

    def alloc(self, need_size):
        num_pages = need_size // self.page_size
        if num_pages > self.free_pages.numel():
            return None
        pages = self.free_pages[:num_pages]
        self.free_pages = self.free_pages[num_pages:]
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + self.offsets).reshape(-1)

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc, kernel):
        bs = seq_lens.numel()
        out = torch.empty((bs,), dtype=torch.int64, device=self.device)
        kernel[(bs,)](seq_lens, last_loc, self.free_pages, out,
                      1 << (bs - 1).bit_length(), self.page_size)
        ps = self.page_size
        num_new = int(((seq_lens_cpu + ps - 1) // ps -
                       (seq_lens_cpu - 1 + ps - 1) // ps).sum())
        if num_new > self.free_pages.numel():
            return None
        self.free_pages = self.free_pages[num_new:]
        return out

    def free(self, slots):
        if slots.numel() == 0:
            return
        if self.page_size == 1:
            self.free_pages = torch.cat((self.free_pages, slots))
            return
        pages = torch.unique(slots // self.page_size)
        self.free_pages = torch.cat((self.free_pages, pages))


def _model_step(device, model_ms):
    """A chain of bf16 matmuls in this process's context, sized to about
    model_ms: returns a function that queues it."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    n = 4096 if device == "cuda" else 256
    a = torch.randn((n, n), dtype=dtype, device=device)
    b = torch.randn((n, n), dtype=dtype, device=device)

    def one():
        return a @ b

    one()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        one()
    if device == "cuda":
        torch.cuda.synchronize()
    per = (time.perf_counter() - start) / 20
    reps = max(1, int(round(model_ms / 1e3 / per)))

    def step():
        for _ in range(reps):
            one()
    return step


def run_process(rank, config, results):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(0)
    rng = np.random.default_rng(1234 + rank)
    kind = config["allocator"]
    mode = config["mode"]
    bs = config["batch"]
    max_len = config["max_len"]

    client = None
    if kind.startswith("pagealloc"):
        import pagealloc
        from pagealloc import sglang
        client = pagealloc.Client.connect(config["target"],
                                          name="engine-loop-%d" % rank)
        page_size = client.pool.page_size
        kwargs = {}
        if kind == "pagealloc-thin":
            kwargs["use_reserve"] = False
        elif kind == "pagealloc-copy":
            kwargs["mirror_pages"] = 0
        allocator = sglang.make_allocator(client, **kwargs)
        pool_pages = client.pool.num_pages
    else:
        page_size = config["page_size"]
        pool_pages = config["pool_pages"] // config["processes"]
        allocator = SGLangFreeList(1, pool_pages, page_size, device)
    kernel = None
    if kind == "sglang" and mode == "decode":
        sys.path.insert(0, config["seed_kernels"])
        from seed_triton_kernels import alloc_decode_kernel as kernel

    model = _model_step(device, config["model_ms"])
    # Pages are 1..pool_pages (page 0 is SGLang's padding page).
    kv = torch.zeros(((pool_pages + 1) * page_size, 8),
                     dtype=torch.float16, device=device)
    # The static slots the baseline writes at (one page per request).
    static_loc = torch.arange(bs, dtype=torch.int64, device=device) * \
        page_size + page_size
    value = torch.ones((bs, 8), dtype=torch.float16, device=device)
    req_to_token = torch.zeros((bs, max_len), dtype=torch.int64,
                               device=device)

    seq = np.zeros(bs, dtype=np.int64)       # tokens each request holds
    target = np.zeros(bs, dtype=np.int64)    # the length it retires at
    last_loc = torch.zeros(bs, dtype=torch.int64, device=device)
    alloc_ns = []
    step_ns = []

    def timed(fn, *args):
        start = time.perf_counter_ns()
        out = fn(*args)
        timed.ns += time.perf_counter_ns() - start
        return out
    timed.ns = 0

    def admit(r):
        prompt = int(rng.integers(64, max_len // 2))
        seq[r] = prompt
        target[r] = min(max_len - 1, prompt + int(rng.integers(16, 512)))
        if kind == "none":
            return True
        need = -(-prompt // page_size) * page_size
        slots = timed(allocator.alloc, need)
        if slots is None:
            return False
        req_to_token[r, :prompt] = slots[:prompt]
        last_loc[r] = slots[prompt - 1]
        return True

    for r in range(bs):
        if not admit(r):
            raise SystemExit("rank %d: the pool cannot hold the batch" % rank)
    if device == "cuda":
        torch.cuda.synchronize()

    rows_index = torch.arange(bs, dtype=torch.int64, device=device)
    offsets = torch.arange(page_size, dtype=torch.int64, device=device)
    total = config["warmup"] + config["steps"]
    stats_before = None
    for step in range(total):
        if step == config["warmup"]:
            stats_before = _reserve_stats(allocator)
        start = time.perf_counter_ns()
        timed.ns = 0
        seq += 1
        if kind == "none":
            loc = static_loc
        elif mode == "alloc":
            starts = np.nonzero((seq - 1) % page_size == 0)[0]
            loc = last_loc + 1
            if starts.size:
                slots = timed(allocator.alloc, int(starts.size) * page_size)
                if slots is None:
                    raise SystemExit("rank %d step %d: out of pages" %
                                     (rank, step))
                index = torch.from_numpy(starts).to(device, non_blocking=True)
                loc[index] = slots[::page_size]
        else:
            seq_dev = torch.from_numpy(seq).to(device, non_blocking=True)
            if kind == "sglang":
                loc = timed(allocator.alloc_decode, seq_dev, seq, last_loc,
                            kernel)
            else:
                loc = timed(allocator.alloc_decode, seq_dev, seq, last_loc)
            if loc is None:
                raise SystemExit("rank %d step %d: out of pages" %
                                 (rank, step))
        kv[loc] = value
        if kind != "none":
            positions = torch.from_numpy(seq - 1).to(device,
                                                     non_blocking=True)
            req_to_token[rows_index, positions] = loc
            last_loc = loc.clone() if kind == "sglang" else loc
            last_loc = last_loc.to(torch.int64)
        model()
        if device == "cuda":
            torch.cuda.synchronize()
        # As SGLang's scheduler does once the step's results are on the
        # host: finished requests free their slots, new ones are admitted.
        for r in np.nonzero(seq >= target)[0]:
            if kind != "none":
                # Whole pages, as SGLang's page-aligned contract frees
                # them: every slot of each page the request holds.
                pages = req_to_token[r, :int(seq[r]):page_size] // page_size
                timed(allocator.free,
                      (pages[:, None] * page_size + offsets).reshape(-1))
            if not admit(r):
                raise SystemExit("rank %d step %d: out of pages" %
                                 (rank, step))
        if step >= config["warmup"]:
            step_ns.append(time.perf_counter_ns() - start)
            alloc_ns.append(timed.ns)
    row = {
        "allocator": kind, "mode": mode, "rank": rank,
        "processes": config["processes"], "page_size": page_size,
        "batch": bs, "device": device,
        "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")) or
        config["mps"],
        "step_ms_p50": percentile(step_ns, 50) / 1e6,
        "step_ms_p99": percentile(step_ns, 99) / 1e6,
        "alloc_us_p50": percentile(alloc_ns, 50) / 1e3,
        "alloc_us_p99": percentile(alloc_ns, 99) / 1e3,
    }
    stats_after = _reserve_stats(allocator)
    if stats_before is not None and stats_after is not None:
        steps = config["steps"]
        refills = stats_after["refills"] - stats_before["refills"]
        row["round_trips_per_step"] = (
            stats_after["sync_refills"] - stats_before["sync_refills"]) / steps
        row["refills_per_step"] = refills / steps
        row["pages_per_refill"] = (
            (stats_after["pages_refilled"] - stats_before["pages_refilled"])
            / max(1, refills))
    if hasattr(allocator, "close"):
        allocator.close()
    results.put(row)


def _reserve_stats(allocator):
    reserve = getattr(allocator, "reserve", None)
    if reserve is None:
        return None
    stats = reserve.stats() if callable(getattr(reserve, "stats", None)) \
        else None
    return stats


def run(config):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=run_process, args=(rank, config, results))
             for rank in range(config["processes"])]
    for p in procs:
        p.start()
    rows = []
    deadline = time.monotonic() + config["timeout_s"]
    while len(rows) < len(procs):
        try:
            rows.append(results.get(timeout=1))
        except queue.Empty:
            failed = [p.exitcode for p in procs
                      if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise SystemExit("%s: a scheduler process failed (exit %s)"
                                 % (config["allocator"], failed or "timeout"))
    for p in procs:
        p.join()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--allocators", default="none,sglang,pagealloc")
    parser.add_argument("--target", default=os.environ.get("PAGEALLOC_TARGET"))
    parser.add_argument("--processes", default="1")
    parser.add_argument("--mode", choices=("alloc", "decode"), default="alloc")
    parser.add_argument("--seed_kernels", default="")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--page_size", type=int, default=16,
                        help="for the sglang allocator (pagealloc: the "
                        "daemon's)")
    parser.add_argument("--pool_pages", type=int, default=262144,
                        help="for the sglang allocator, split among the "
                        "processes")
    parser.add_argument("--max_len", type=int, default=2048)
    parser.add_argument("--model_ms", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of every allocator, in turn")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--timeout_s", type=float, default=600)
    parser.add_argument("--mps", action="store_true",
                        help="record that an MPS daemon serves this run")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    if args.rounds < 1:
        raise SystemExit("--rounds (%d) must be >= 1" % args.rounds)
    table = []
    kinds = args.allocators.split(",")
    baseline = None
    for processes, round_index, kind in (
            (p, r, k) for p in [int(p) for p in args.processes.split(",")]
            for r in range(args.rounds) for k in kinds):
        if kind == kinds[0]:
            baseline = None  # each round's cost over its own `none`
        if kind.startswith("pagealloc") and not args.target:
            raise SystemExit("--target (or PAGEALLOC_TARGET) is needed "
                             "for %s" % kind)
        if kind == "sglang" and args.mode == "decode" and \
                not args.seed_kernels:
            raise SystemExit("--seed_kernels is needed for sglang in "
                             "decode mode")
        config = dict(vars(args), allocator=kind, processes=processes)
        rows = run(config)
        summary = {
            "allocator": kind, "processes": processes, "mode": args.mode,
            "round": round_index,
            "mps": rows[0]["mps"], "device": rows[0]["device"],
            "page_size": rows[0]["page_size"], "batch": args.batch,
            "step_ms_p50": max(r["step_ms_p50"] for r in rows),
            "step_ms_p99": max(r["step_ms_p99"] for r in rows),
            "alloc_us_p50": max(r["alloc_us_p50"] for r in rows),
            "alloc_us_p99": max(r["alloc_us_p99"] for r in rows),
            "per_process": rows,
        }
        for key in ("round_trips_per_step", "refills_per_step",
                    "pages_per_refill"):
            if key in rows[0]:
                summary[key] = max(r[key] for r in rows)
        if kind == "none":
            baseline = summary["step_ms_p50"]
        if baseline is not None:
            summary["over_none_us"] = \
                (summary["step_ms_p50"] - baseline) * 1e3
        table.append(summary)
        print(json.dumps({k: v for k, v in summary.items()
                          if k != "per_process"}), flush=True)
    print()
    print("| allocator | procs | MPS | step p50 ms | over none us | "
          "alloc host p50 us | p99 us | round trips/step | pages/refill |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in table:
        print("| %s | %d | %s | %.3f | %s | %.1f | %.1f | %s | %s |" % (
            s["allocator"], s["processes"], "on" if s["mps"] else "off",
            s["step_ms_p50"],
            "%.0f" % s["over_none_us"] if "over_none_us" in s else "-",
            s["alloc_us_p50"], s["alloc_us_p99"],
            "%.3f" % s["round_trips_per_step"]
            if "round_trips_per_step" in s else "-",
            "%.1f" % s["pages_per_refill"]
            if "pages_per_refill" in s else "-"))
    if args.rounds > 1:
        _print_rounds(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return table


def _print_rounds(table):
    """Per allocator and process count, the median over the rounds of the
    step's p50, of its cost over that round's `none`, and of the
    allocation's host time, with the range of the cost."""
    print()
    print("| allocator | procs | MPS | rounds | step p50 ms, median | "
          "over none us, median (range) | alloc host p50 us, median |")
    print("|---|---|---|---|---|---|---|")
    keys = []
    for s in table:
        if (s["allocator"], s["processes"]) not in keys:
            keys.append((s["allocator"], s["processes"]))
    for kind, processes in keys:
        rows = [s for s in table
                if s["allocator"] == kind and s["processes"] == processes]
        over = [s["over_none_us"] for s in rows if "over_none_us" in s]
        print("| %s | %d | %s | %d | %.3f | %s | %.1f |" % (
            kind, processes, "on" if rows[0]["mps"] else "off", len(rows),
            percentile([s["step_ms_p50"] for s in rows], 50),
            "%.0f (%.0f to %.0f)" % (percentile(over, 50), min(over),
                                      max(over)) if over else "-",
            percentile([s["alloc_us_p50"] for s in rows], 50)))


if __name__ == "__main__":
    main()

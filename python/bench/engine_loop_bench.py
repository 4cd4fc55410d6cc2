#!/usr/bin/python3
"""A scheduler's decode loop with each allocator, in 1..N scheduler
processes on one GPU: what an engine pays per step for its KV allocation.

    engine_loop_bench.py --allocators none,sglang,pagealloc \\
        --target unix:///run/pagealloc/gpu0.sock --processes 1,2,4 \\
        [--seed_kernels DIR] [--mode alloc|decode] [--steps 400] \\
        [--rounds 5] [--interleave B] [--json OUT]

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
p50/p99 (us), the step's phases (queueing its GPU work, planning and
allocation included; the wait for the GPU; retiring and admitting), cost
per step over `none` (p50 step difference, us), and for
the pagealloc allocators the round trips per step and pages per refill
(from the reserve's counters). The step's cost over `none` moves by
hundreds of microseconds from one run of the loop to the next (the GPU's
clocks, the host's scheduling), more than the allocators differ: with
--rounds R every allocator runs R times, the allocators in turn within each
round, each round's cost over that round's `none`, and a second table gives
per allocator the median over the rounds and their range. With
--interleave B every process instead holds every allocator's loop at once
(the same requests, the same model step) and runs them B steps each in
turn: a block's median step less that of the `none` block before it, and
less SGLang's block in the same cycle, per cycle, whose medians and
quartiles a last table gives. Drift then falls on every allocator alike.
Keep the other allocators' blocks (about 2 * B steps) under the reserve's
idle bound (100 ms by default): past it a reserve halves its batch and
returns pages, as in a scheduler gone idle, and the rows then measure
that (returns_per_step in the JSON).
Run it with and without MPS
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


class SchedulerLoop:
    """One allocator's scheduler in this process: its requests, its KV
    tensor and req_to_token, and the step that allocates, writes, runs the
    model and frees (the module's docstring). Loops of several allocators
    in one process share the model step and replay the same requests (the
    same seed), so that they differ in their allocator only."""

    def __init__(self, kind, config, rank, device, model):
        self.kind = kind
        self.config = config
        self.device = device
        self.model = model
        self.rng = np.random.default_rng(1234 + rank)
        self.mode = mode = config["mode"]
        bs = config["batch"]
        self.max_len = max_len = config["max_len"]
        self.client = None
        if kind.startswith("pagealloc"):
            import pagealloc
            from pagealloc import sglang
            self.client = pagealloc.Client.connect(
                config["target"], name="engine-loop-%d" % rank)
            page_size = self.client.pool.page_size
            kwargs = {}
            if kind == "pagealloc-thin":
                kwargs["use_reserve"] = False
            elif kind == "pagealloc-copy":
                kwargs["mirror_pages"] = 0
            self.allocator = sglang.make_allocator(self.client, **kwargs)
            pool_pages = self.client.pool.num_pages
        else:
            page_size = config["page_size"]
            pool_pages = config["pool_pages"] // config["processes"]
            self.allocator = SGLangFreeList(1, pool_pages, page_size, device)
        self.page_size = page_size
        self.kernel = None
        if kind == "sglang" and mode == "decode":
            sys.path.insert(0, config["seed_kernels"])
            from seed_triton_kernels import alloc_decode_kernel
            self.kernel = alloc_decode_kernel
        # Pages are 1..pool_pages (page 0 is SGLang's padding page).
        self.kv = torch.zeros(((pool_pages + 1) * page_size, 8),
                              dtype=torch.float16, device=device)
        # The static slots the baseline writes at (one page per request).
        self.static_loc = torch.arange(bs, dtype=torch.int64,
                                       device=device) * page_size + page_size
        self.value = torch.ones((bs, 8), dtype=torch.float16, device=device)
        self.req_to_token = torch.zeros((bs, max_len), dtype=torch.int64,
                                        device=device)
        self.seq = np.zeros(bs, dtype=np.int64)     # tokens each holds
        self.target = np.zeros(bs, dtype=np.int64)  # the length it retires at
        self.last_loc = torch.zeros(bs, dtype=torch.int64, device=device)
        self.rows_index = torch.arange(bs, dtype=torch.int64, device=device)
        self.offsets = torch.arange(page_size, dtype=torch.int64,
                                    device=device)
        self.alloc_ns = 0  # the allocator's host time in this step
        for r in range(bs):
            if not self._admit(r):
                raise SystemExit("rank %d: the pool cannot hold the batch" %
                                 rank)
        if device == "cuda":
            torch.cuda.synchronize()

    def _timed(self, fn, *args):
        start = time.perf_counter_ns()
        out = fn(*args)
        self.alloc_ns += time.perf_counter_ns() - start
        return out

    def _admit(self, r):
        prompt = int(self.rng.integers(64, self.max_len // 2))
        self.seq[r] = prompt
        self.target[r] = min(self.max_len - 1,
                             prompt + int(self.rng.integers(16, 512)))
        if self.kind == "none":
            return True
        ps = self.page_size
        slots = self._timed(self.allocator.alloc, -(-prompt // ps) * ps)
        if slots is None:
            return False
        self.req_to_token[r, :prompt] = slots[:prompt]
        self.last_loc[r] = slots[prompt - 1]
        return True

    def step(self):
        """One decode step, in ns: its wall time, the allocator's host time
        in it, and its three phases (queueing the step's GPU work, the
        wait for it, retiring and admitting requests)."""
        kind, ps, device = self.kind, self.page_size, self.device
        seq = self.seq
        start = time.perf_counter_ns()
        self.alloc_ns = 0
        seq += 1
        if kind == "none":
            loc = self.static_loc
        elif self.mode == "alloc":
            starts = np.nonzero((seq - 1) % ps == 0)[0]
            loc = self.last_loc + 1
            if starts.size:
                slots = self._timed(self.allocator.alloc,
                                    int(starts.size) * ps)
                if slots is None:
                    raise SystemExit("%s: out of pages" % kind)
                index = torch.from_numpy(starts).to(device, non_blocking=True)
                loc[index] = slots[::ps]
        else:
            seq_dev = torch.from_numpy(seq).to(device, non_blocking=True)
            args = (seq_dev, seq, self.last_loc)
            if kind == "sglang":
                args += (self.kernel,)
            loc = self._timed(self.allocator.alloc_decode, *args)
            if loc is None:
                raise SystemExit("%s: out of pages" % kind)
        self.kv[loc] = self.value
        if kind != "none":
            positions = torch.from_numpy(seq - 1).to(device,
                                                     non_blocking=True)
            self.req_to_token[self.rows_index, positions] = loc
            last_loc = loc.clone() if kind == "sglang" else loc
            self.last_loc = last_loc.to(torch.int64)
        self.model()
        queued = time.perf_counter_ns()
        if device == "cuda":
            torch.cuda.synchronize()
        synced = time.perf_counter_ns()
        # As SGLang's scheduler does once the step's results are on the
        # host: finished requests free their slots, new ones are admitted.
        for r in np.nonzero(seq >= self.target)[0]:
            if kind != "none":
                # Whole pages, as SGLang's page-aligned contract frees
                # them: every slot of each page the request holds.
                pages = self.req_to_token[r, :int(seq[r]):ps] // ps
                self._timed(self.allocator.free,
                            (pages[:, None] * ps + self.offsets).reshape(-1))
            if not self._admit(r):
                raise SystemExit("%s: out of pages" % kind)
        end = time.perf_counter_ns()
        return (end - start, self.alloc_ns, queued - start, synced - queued,
                end - synced)

    def reserve_stats(self):
        return _reserve_stats(self.allocator)

    def close(self):
        if hasattr(self.allocator, "close"):
            self.allocator.close()


def _row(loop, config, rank, times, stats_before):
    """The result row of one allocator's steps in one process (`times`:
    SchedulerLoop.step's tuples)."""
    step_ns = [t[0] for t in times]
    alloc_ns = [t[1] for t in times]
    row = {
        "allocator": loop.kind, "mode": loop.mode, "rank": rank,
        "processes": config["processes"], "page_size": loop.page_size,
        "batch": config["batch"], "device": loop.device,
        "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")) or
        config["mps"],
        "step_ms_p50": percentile(step_ns, 50) / 1e6,
        "step_ms_p99": percentile(step_ns, 99) / 1e6,
        "alloc_us_p50": percentile(alloc_ns, 50) / 1e3,
        "alloc_us_p99": percentile(alloc_ns, 99) / 1e3,
        "alloc_us_mean": float(np.mean(alloc_ns)) / 1e3,
        # Where the step's time went: queueing its work (planning and
        # allocating included), waiting for the GPU, retiring and admitting.
        "queue_us_p50": percentile([t[2] for t in times], 50) / 1e3,
        "sync_us_p50": percentile([t[3] for t in times], 50) / 1e3,
        "retire_us_p50": percentile([t[4] for t in times], 50) / 1e3,
    }
    stats_after = loop.reserve_stats()
    if stats_before is not None and stats_after is not None:
        steps = len(step_ns)
        refills = stats_after["refills"] - stats_before["refills"]
        row["round_trips_per_step"] = (
            stats_after["sync_refills"] - stats_before["sync_refills"]) / steps
        row["refills_per_step"] = refills / steps
        row["pages_per_refill"] = (
            (stats_after["pages_refilled"] - stats_before["pages_refilled"])
            / max(1, refills))
        # Pages leaving the reserve: past its high mark, when idle, or for
        # the daemon's asks on behalf of a starving session (reclaims).
        row["returns_per_step"] = (
            stats_after["returns"] - stats_before["returns"]) / steps
        row["pages_returned_per_step"] = (
            stats_after["pages_returned"] - stats_before["pages_returned"]
        ) / steps
        row["reclaims"] = stats_after["reclaims"] - stats_before["reclaims"]
        if "mirror_hits" in stats_after and "mirror_hits" in stats_before:
            hits = stats_after["mirror_hits"] - stats_before["mirror_hits"]
            misses = (stats_after["mirror_misses"] -
                      stats_before["mirror_misses"])
            row["mirror_hit_rate"] = hits / max(1, hits + misses)
    return row


def run_process(rank, config, results):
    """One scheduler process: config["allocator"]'s loop for warmup + steps
    steps; with config["interleave"] B > 0, config["allocators"]' loops
    side by side, B steps each in turn, and per allocator the per-cycle
    difference of its block's median step from the first allocator's."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(0)
    model = _model_step(device, config["model_ms"])
    block = config["interleave"]
    kinds = (config["allocators"].split(",") if block
             else [config["allocator"]])
    loops = [SchedulerLoop(kind, config, rank, device, model)
             for kind in kinds]
    for loop in loops:
        for _ in range(config["warmup"]):
            loop.step()
    stats_before = [loop.reserve_stats() for loop in loops]
    steps = config["steps"]
    block = block or steps
    times = [[] for _ in loops]  # SchedulerLoop.step's tuples
    block_p50 = [[] for _ in loops]  # each block's median step, ns
    while len(times[0]) < steps:
        for i, loop in enumerate(loops):
            block_times = [loop.step() for _ in range(
                min(block, steps - len(times[i])))]
            times[i] += block_times
            block_p50[i].append(percentile([t[0] for t in block_times], 50))
    rows = []
    for i, loop in enumerate(loops):
        row = _row(loop, config, rank, times[i], stats_before[i])
        if config["interleave"]:
            over = [(mine - first) / 1e3
                    for mine, first in zip(block_p50[i], block_p50[0])]
            row["over_first_us_cycles"] = over
        rows.append(row)
        loop.close()
    results.put(rows if config["interleave"] else rows[0])


def _reserve_stats(allocator):
    """The reserve's counters, with the device mirror's hits and misses
    (mirror_hits, mirror_misses) where it has one; None without a
    reserve."""
    reserve = getattr(allocator, "reserve", None)
    if reserve is None or not callable(getattr(reserve, "stats", None)):
        return None
    stats = dict(reserve.stats())
    mirror = getattr(allocator, "mirror_stats", None)
    if mirror is not None:
        stats["mirror_hits"] = mirror["hits"]
        stats["mirror_misses"] = mirror["misses"]
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
    parser.add_argument("--interleave", type=int, default=0,
                        metavar="B",
                        help="every process runs every allocator side by "
                        "side, B steps each in turn (0: one run per "
                        "allocator)")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--timeout_s", type=float, default=600)
    parser.add_argument("--mps", action="store_true",
                        help="record that an MPS daemon serves this run")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    if args.rounds < 1:
        raise SystemExit("--rounds (%d) must be >= 1" % args.rounds)
    if args.interleave < 0:
        raise SystemExit("--interleave (%d) must be >= 0" % args.interleave)
    kinds = args.allocators.split(",")
    if args.interleave and kinds[0] != "none":
        raise SystemExit("--interleave measures against `none`: name it "
                         "first in --allocators")
    for kind in kinds:
        if kind.startswith("pagealloc") and not args.target:
            raise SystemExit("--target (or PAGEALLOC_TARGET) is needed "
                             "for %s" % kind)
        if kind == "sglang" and args.mode == "decode" and \
                not args.seed_kernels:
            raise SystemExit("--seed_kernels is needed for sglang in "
                             "decode mode")
    table = []
    for processes in [int(p) for p in args.processes.split(",")]:
        for round_index in range(args.rounds):
            if args.interleave:
                # Every process runs every allocator, in blocks, in turn.
                config = dict(vars(args), allocator=args.allocators,
                              processes=processes)
                per_process = run(config)
                runs = [(kind, [rows[i] for rows in per_process])
                        for i, kind in enumerate(kinds)]
            else:
                runs = []
                for kind in kinds:
                    config = dict(vars(args), allocator=kind,
                                  processes=processes)
                    runs.append((kind, run(config)))
            baseline = None  # each round's cost over its own `none`
            for kind, rows in runs:
                summary = _summary(kind, processes, round_index, rows, args)
                if kind == "none":
                    baseline = summary["step_ms_p50"]
                if args.interleave:
                    # The median over the cycles (and processes) of a
                    # block's median step less the `none` block's before it.
                    cycles = [c for r in rows
                              for c in r["over_first_us_cycles"]]
                    summary["over_none_us_cycles"] = cycles
                    summary["over_none_us"] = percentile(cycles, 50)
                elif baseline is not None:
                    summary["over_none_us"] = \
                        (summary["step_ms_p50"] - baseline) * 1e3
                table.append(summary)
            if args.interleave and "sglang" in kinds:
                _pair_with_sglang(table[-len(kinds):])
            for summary in table[-len(kinds):]:
                print(json.dumps({k: v for k, v in summary.items()
                                  if not k.endswith("_cycles") and
                                  k != "per_process"}), flush=True)
    print()
    print("| allocator | procs | MPS | step p50 ms | over none us | "
          "alloc host p50 us | p99 us | queue / GPU wait / retire p50 us | "
          "round trips/step | pages/refill |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in table:
        print("| %s | %d | %s | %.3f | %s | %.1f | %.1f | %.0f / %.0f / %.0f "
              "| %s | %s |" % (
            s["allocator"], s["processes"], "on" if s["mps"] else "off",
            s["step_ms_p50"],
            "%.0f" % s["over_none_us"] if "over_none_us" in s else "-",
            s["alloc_us_p50"], s["alloc_us_p99"], s["queue_us_p50"],
            s["sync_us_p50"], s["retire_us_p50"],
            "%.3f" % s["round_trips_per_step"]
            if "round_trips_per_step" in s else "-",
            "%.1f" % s["pages_per_refill"]
            if "pages_per_refill" in s else "-"))
    if args.rounds > 1:
        _print_rounds(table)
    if args.interleave:
        _print_cycles(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return table


def _summary(kind, processes, round_index, rows, args):
    """One allocator's row over its processes' rows: the slowest
    process's figures."""
    summary = {
        "allocator": kind, "processes": processes, "mode": args.mode,
        "round": round_index, "interleave": args.interleave,
        "mps": rows[0]["mps"], "device": rows[0]["device"],
        "page_size": rows[0]["page_size"], "batch": args.batch,
        "step_ms_p50": max(r["step_ms_p50"] for r in rows),
        "step_ms_p99": max(r["step_ms_p99"] for r in rows),
        "alloc_us_p50": max(r["alloc_us_p50"] for r in rows),
        "alloc_us_p99": max(r["alloc_us_p99"] for r in rows),
        "queue_us_p50": max(r["queue_us_p50"] for r in rows),
        "sync_us_p50": max(r["sync_us_p50"] for r in rows),
        "retire_us_p50": max(r["retire_us_p50"] for r in rows),
        "per_process": rows,
    }
    for key in ("round_trips_per_step", "refills_per_step",
                "pages_per_refill"):
        if key in rows[0]:
            summary[key] = max(r[key] for r in rows)
    if "mirror_hit_rate" in rows[0]:
        summary["mirror_hit_rate"] = min(r["mirror_hit_rate"] for r in rows)
    return summary


def _pair_with_sglang(summaries):
    """For each allocator of one interleaved round but `none`: its block's
    median step less SGLang's block's in the same cycle and process (the
    sharpest comparison the run holds: the two blocks ran moments apart),
    per cycle and their median."""
    sglang = next(s for s in summaries if s["allocator"] == "sglang")
    for s in summaries:
        if s["allocator"] != "none":
            pairs = [mine - theirs for mine, theirs in zip(
                s["over_none_us_cycles"], sglang["over_none_us_cycles"])]
            s["vs_sglang_us_cycles"] = pairs
            s["vs_sglang_us"] = percentile(pairs, 50)


def _print_cycles(table):
    """Per allocator and process count, over every interleaved cycle of
    every round and process: the block's cost over `none` and its
    difference from SGLang's, as median (quartiles)."""
    print()
    print("| allocator | procs | MPS | cycles | over none us, median "
          "(p25 to p75) | over SGLang us, median (p25 to p75) |")
    print("|---|---|---|---|---|---|")
    keys = []
    for s in table:
        if (s["allocator"], s["processes"]) not in keys:
            keys.append((s["allocator"], s["processes"]))

    def quartiles(values):
        return "%.0f (%.0f to %.0f)" % (percentile(values, 50),
                                        percentile(values, 25),
                                        percentile(values, 75))
    for kind, processes in keys:
        if kind == "none":
            continue
        rows = [s for s in table
                if s["allocator"] == kind and s["processes"] == processes]
        over = [c for s in rows for c in s["over_none_us_cycles"]]
        pairs = [c for s in rows for c in s.get("vs_sglang_us_cycles", [])]
        print("| %s | %d | %s | %d | %s | %s |" % (
            kind, processes, "on" if rows[0]["mps"] else "off", len(over),
            quartiles(over), quartiles(pairs) if pairs else "-"))


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

#!/usr/bin/python3
"""N scheduler replicas serving one request stream on one device, with the
same total KV memory three ways: what one pagealloc pool, and its shared
prefix cache, buy over a pool split per replica.

    multi_replica_bench.py --target unix:///run/pagealloc/gpu0.sock \\
        --setups split,shared,shared-prefix --replicas 1,2,3 [--json OUT]

The daemon at --target must serve the model's KV layout: --semantics=sglang,
--page_size and --num_pages as given here, and
--kv_layout=mha:layers=L,kv_heads=KVH,head_dim=HD,dtype=D (the command
prints the flags it expects with --print_daemon_flags).

Each replica is a process with a small decoder-only transformer (random
weights from one seed, so every replica and the reference are one model):
token and position embeddings, --layers blocks of grouped-query attention
and an MLP, tied output. Attention reads K and V from a paged KV store at
the slots the replica's allocator gave, as a serving engine's paged kernel
does (in PyTorch, a gather of every request's slots padded to the longest
context, and a masked softmax). The scheduler batches continuously: each
step admits what fits (a request's pages for its whole length up front, so
no request waits on pages once running), then runs one batched forward
over the next chunk of --prefill_chunk tokens of every request still in
its prefill (chunks padded to the longest, causal within the chunk over
the prefix) and one over every request past its prefill (a token each),
writing the new tokens' K/V at their slots, and takes the step's greedy
tokens to the host at once: one sync a step, however many sequences run.

Set-ups, one KV budget of --num_pages pages in each:
  split          each replica its own in-process SGLang-style free list of
                 num_pages / N pages and KV tensors of its own
  shared         the replicas on the daemon's pool through pagealloc.sglang
                 (the page reserve), K/V in the daemon's slab
  shared-prefix  shared, plus the daemon's prefix cache: a request matches
                 the chained keys of its prompt's full pages, adopts the
                 pages found (no prefill for them), and publishes the full
                 pages it computed, so every replica reuses every other's

Requests: --system_prompts prompts of --system_tokens tokens, each request
one of them followed by a unique suffix of --suffix_tokens (a range) and
--new_tokens to generate, from --seed; dealt to the replicas in turn. With
--stagger_s replica r starts r * stagger seconds after the first (the
launch-order skew of replicas that start one after another). With
--arrival_rate the requests arrive as a seeded Poisson stream of that many
a second (over all replicas; TTFT counts from a request's arrival),
otherwise all at the start. On CUDA each set-up first serves
--warmup_requests with one replica, untimed.

Reports per set-up and replica count: requests/s, output tokens/s, time to
first token and per output token (p50/p99 over requests), the most
sequences any replica ran at once (and the least of the replicas' peaks),
the prefix hit rate (pages found / pages looked up; each
shared-prefix run starts from an empty cache) and the KV those hits reused
(MiB: the pages adopted instead of prefilled into a page of the
replica's own, K and V of every layer). --check compares
every request's tokens with a single-process reference that runs each
request alone over contiguous KV (CI runs that on the CPU). A benchmark,
not a test: it never fails on time.
"""

import argparse
import collections
import hashlib
import json
import math
import multiprocessing
import os
import queue
import shutil
import subprocess
import time

import numpy as np
import torch

SETUPS = ("split", "shared", "shared-prefix")


# ------------------------------------------------------------------ model

class TinyDecoder:
    """The model every replica runs: weights from `seed`, the same in
    every process. forward_batch() runs a scheduler step's requests, each
    with its chunk of tokens, in one pass against their K/V in `kv` (a
    TensorKv); forward() runs one request's chunk alone, the statement of
    the computation that the reference uses."""

    def __init__(self, args, device, dtype):
        self.args = args
        self.dtype = dtype
        g = torch.Generator().manual_seed(args.seed)
        hidden, hd = args.hidden, args.head_dim

        def weight(*shape):
            w = torch.randn(*shape, generator=g, dtype=torch.float64)
            return (w / math.sqrt(shape[0])).to(device=device, dtype=dtype)

        self.embed = weight(args.vocab, hidden)
        self.position = weight(args.max_len, hidden)
        self.layers = [dict(
            wq=weight(hidden, args.heads * hd),
            wk=weight(hidden, args.kv_heads * hd),
            wv=weight(hidden, args.kv_heads * hd),
            wo=weight(args.heads * hd, hidden),
            w1=weight(hidden, 2 * hidden),
            w2=weight(2 * hidden, hidden)) for _ in range(args.layers)]
        self.device = device

    @staticmethod
    def _norm(x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    def forward(self, kv, tokens, start, slots):
        """Request tokens[start:] (the chunk) at positions start..: writes
        their K/V at slots[start:len(tokens)] and attends over
        slots[:len(tokens)]. Returns the greedy next token after the
        chunk's last."""
        a = self.args
        end = len(tokens)
        n = end - start
        ids = torch.as_tensor(tokens[start:end], device=self.device)
        positions = torch.arange(start, end, device=self.device)
        own = torch.as_tensor(slots[start:end], device=self.device)
        context = torch.as_tensor(slots[:end], device=self.device)
        x = self.embed[ids] + self.position[positions]
        group = a.heads // a.kv_heads
        # Query i (position start + i) sees context positions <= its own.
        mask = (torch.arange(end, device=self.device)[None, :] >
                positions[:, None])
        for layer_index, w in enumerate(self.layers):
            h = self._norm(x)
            q = (h @ w["wq"]).view(n, a.heads, a.head_dim)
            k = (h @ w["wk"]).view(n, a.kv_heads, a.head_dim)
            v = (h @ w["wv"]).view(n, a.kv_heads, a.head_dim)
            kv.write(layer_index, own, k, v)
            keys, values = kv.read(layer_index, context)
            keys = keys.to(self.dtype).repeat_interleave(group, dim=1)
            values = values.to(self.dtype).repeat_interleave(group, dim=1)
            scores = torch.einsum("nhd,thd->hnt", q, keys) / math.sqrt(
                a.head_dim)
            scores = scores.masked_fill(mask[None], float("-inf"))
            attended = torch.einsum("hnt,thd->nhd", scores.softmax(-1),
                                    values)
            x = x + attended.reshape(n, -1) @ w["wo"]
            x = x + torch.nn.functional.silu(self._norm(x) @ w["w1"]) @ w["w2"]
        logits = self._norm(x[-1]) @ self.embed.T
        return int(torch.argmax(logits))

    def batch(self, chunks):
        """Returns the device inputs of one forward_batch() over `chunks`,
        a list of (tokens, start, end, slots): request i computes
        tokens[start:end] at positions start.. and attends over its
        slots[:end]. The chunks' tokens are packed one after another; for
        attention, each chunk's queries take a row of a [chunks, longest
        chunk] grid and its context a row of [chunks, longest context].
        Every index goes to the device in one copy."""
        b = len(chunks)
        n = max(end - start for _, start, end, _ in chunks)
        t = max(end for _, _, end, _ in chunks)
        ids, positions, own, placed = [], [], [], []
        # A padding query sits at position 0 (it sees its row's first
        # context entry only, so its softmax has a finite entry); padding
        # context is slot 0 (a valid slot to gather, masked out for every
        # real query).
        grid = np.zeros((b, n), dtype=np.int64)
        context = np.zeros((b, t), dtype=np.int64)
        last = np.empty(b, dtype=np.int64)
        packed = 0
        for i, (tokens, start, end, slots) in enumerate(chunks):
            ids.append(tokens[start:end])
            positions.append(np.arange(start, end))
            own.append(slots[start:end])
            placed.append(np.arange(i * n, i * n + end - start))
            grid[i, :end - start] = positions[-1]
            context[i, :end] = slots[:end]
            packed += end - start
            last[i] = packed - 1
        parts = [np.concatenate(ids).astype(np.int64),
                 np.concatenate(positions), np.concatenate(own),
                 np.concatenate(placed), grid, context, last]
        flat = torch.as_tensor(np.concatenate([a.reshape(-1) for a in parts]),
                               device=self.device)
        views = torch.split(flat, [a.size for a in parts])
        names = ("ids", "positions", "own", "placed", "grid", "context",
                 "last")
        return {name: v.view(a.shape)
                for name, v, a in zip(names, views, parts)}

    def forward_batch(self, kv, batch):
        """Runs the chunks of `batch` (from batch()) in one pass: the
        projections and MLPs over the packed tokens, K/V written at every
        token's slot at once, and attention over a padded gather of every
        chunk's context with a mask (causal within the chunk, over its
        prefix). Returns the greedy next token after each chunk's last, a
        [chunks] tensor on the device: the caller takes it to the host,
        once a step."""
        a = self.args
        grid, context = batch["grid"], batch["context"]
        b, n = grid.shape
        group = a.heads // a.kv_heads
        placed = batch["placed"]
        # Query (i, j) sees chunk i's context positions <= its own; padded
        # context entries lie past every real query of their chunk.
        mask = (torch.arange(context.shape[1], device=self.device)
                [None, None, :] > grid[:, :, None])[:, None, None]
        x = self.embed[batch["ids"]] + self.position[batch["positions"]]
        for layer_index, w in enumerate(self.layers):
            h = self._norm(x)                          # [tokens, hidden]
            k = (h @ w["wk"]).view(-1, a.kv_heads, a.head_dim)
            v = (h @ w["wv"]).view(-1, a.kv_heads, a.head_dim)
            kv.write(layer_index, batch["own"], k, v)
            q = h.new_zeros(b * n, a.heads * a.head_dim)
            q[placed] = h @ w["wq"]
            q = q.view(b, n, a.kv_heads, group, a.head_dim)  # kvh x group
            keys, values = kv.read(layer_index, context)  # [b, t, kvh, hd]
            keys, values = keys.to(self.dtype), values.to(self.dtype)
            scores = torch.einsum("bnkgd,btkd->bkgnt", q, keys) / math.sqrt(
                a.head_dim)
            scores = scores.masked_fill(mask, float("-inf"))
            attended = torch.einsum("bkgnt,btkd->bnkgd", scores.softmax(-1),
                                    values).reshape(b * n, -1)[placed]
            x = x + attended @ w["wo"]
            x = x + torch.nn.functional.silu(self._norm(x) @ w["w1"]) @ w["w2"]
        return torch.argmax(self._norm(x[batch["last"]]) @ self.embed.T,
                            dim=-1)


class TensorKv:
    """K/V buffers [slots, kv_heads, head_dim] per layer: torch tensors of
    this process, or views of the daemon's slab."""

    def __init__(self, keys, values):
        self.keys, self.values = keys, values

    def write(self, layer, slots, k, v):
        self.keys[layer][slots] = k.to(self.keys[layer].dtype)
        self.values[layer][slots] = v.to(self.values[layer].dtype)

    def read(self, layer, slots):
        return self.keys[layer][slots], self.values[layer][slots]


def kv_dtype(args):
    return {"fp32": torch.float32, "fp16": torch.float16,
            "bf16": torch.bfloat16}[args.kv_dtype]


def own_kv(args, num_slots, device):
    shape = (num_slots, args.kv_heads, args.head_dim)
    make = lambda: [torch.zeros(shape, dtype=kv_dtype(args), device=device)
                    for _ in range(args.layers)]
    return TensorKv(make(), make())


def slab_kv(client, args, device):
    def view(name):
        buffer = client.kv_buffer(name)
        if device == "cuda":
            return torch.as_tensor(buffer, device="cuda")
        return torch.from_numpy(np.asarray(buffer))
    return TensorKv([view("k.%d" % i) for i in range(args.layers)],
                    [view("v.%d" % i) for i in range(args.layers)])


# --------------------------------------------------------------- requests

def make_requests(args):
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, args.vocab, size=args.system_tokens).tolist()
               for _ in range(args.system_prompts)]
    low, high = args.suffix_tokens
    requests = []
    arrival = 0.0
    for i in range(args.requests):
        suffix = rng.integers(0, args.vocab,
                              size=int(rng.integers(low, high + 1))).tolist()
        requests.append(dict(id=i, prompt=prompts[i % len(prompts)] + suffix,
                             arrival=arrival))
        if args.arrival_rate > 0:
            # A Poisson stream of that many requests a second, over all
            # replicas: request i is eligible `arrival` seconds after its
            # replica's start.
            arrival += float(rng.exponential(1.0 / args.arrival_rate))
    return requests


def reference_outputs(args, requests, device="cpu"):
    """Each request alone over contiguous K/V, through forward() (not the
    replicas' batched path): the tokens a correct paged engine generates,
    whatever its batching and caching."""
    model = TinyDecoder(args, device, compute_dtype(args, device))
    total = args.max_len
    outputs = {}
    for request in requests:
        kv = own_kv(args, total, device)
        slots = list(range(total))
        tokens = list(request["prompt"])
        out = []
        start = 0
        for _ in range(args.new_tokens):
            token = model.forward(kv, tokens, start, slots)
            out.append(token)
            start = len(tokens)
            tokens.append(token)
        outputs[request["id"]] = out
    return outputs


def compute_dtype(args, device):
    if args.compute_dtype:
        return getattr(torch, args.compute_dtype)
    return torch.bfloat16 if device == "cuda" else torch.float64


def chain_keys(tokens, page_size, pages):
    """vLLM-style chained page keys of tokens' first `pages` full pages."""
    keys, parent = [], b""
    for p in range(pages):
        page = np.asarray(tokens[p * page_size:(p + 1) * page_size],
                          dtype=np.int64)
        parent = hashlib.sha256(parent + page.tobytes()).digest()
        keys.append(parent)
    return keys


# ------------------------------------------------------------ KV pools

class SplitPool:
    """Set-up split: this replica's own free list of pages 1..num_pages
    (SGLang's paged allocator in one process) over K/V of its own."""

    def __init__(self, args, num_pages, device):
        self.ps = args.page_size
        self.free_pages = collections.deque(range(1, num_pages + 1))
        self.kv = own_kv(args, (num_pages + 1) * self.ps, device)
        self.lookups = self.hits = 0

    def admit(self, request, pages):
        if pages > len(self.free_pages):
            return None
        own = [self.free_pages.popleft() for _ in range(pages)]
        return dict(pages=own, cached_tokens=0)

    def computed(self, request, grant):
        pass

    def finish(self, grant):
        self.free_pages.extend(grant["pages"])

    def close(self):
        pass


class SharedPool:
    """Set-up shared: pagealloc.sglang's allocator on the daemon's pool,
    K/V in the daemon's slab."""

    def __init__(self, args, client, device):
        from pagealloc import sglang
        self.ps = args.page_size
        self.client = client
        self.allocator = sglang.make_allocator(client)
        self.kv = slab_kv(client, args, device)
        self.lookups = self.hits = 0

    def _own(self, pages):
        if pages == 0:
            return []
        slots = self.allocator.alloc(pages * self.ps)
        if slots is None:
            return None
        return (np.asarray(slots.cpu() if hasattr(slots, "cpu") else slots)
                [::self.ps] // self.ps).tolist()

    def admit(self, request, pages):
        own = self._own(pages)
        return None if own is None else dict(pages=own, cached_tokens=0)

    def computed(self, request, grant):
        pass

    def _free_own(self, pages):
        if pages:
            p = np.asarray(pages, dtype=np.int64)
            self.allocator.free((p[:, None] * self.ps +
                                 np.arange(self.ps)).reshape(-1))

    def finish(self, grant):
        self._free_own(grant["pages"])

    def close(self):
        self.allocator.close()


class SharedPrefixPool(SharedPool):
    """Set-up shared-prefix: shared, and the prompt's full pages through the
    daemon's prefix cache. The pages found are adopted (the request holds a
    reference on each); the full prompt pages it computes come from the
    daemon's thin alloc (they leave the session when published, which a
    reserve's pages must not) and are published once written; the rest from
    the allocator's reserve."""

    def admit(self, request, pages):
        prompt = request["prompt"]
        # The last prompt token is always computed: its logits give the
        # first output token.
        cacheable = (len(prompt) - 1) // self.ps
        keys = chain_keys(prompt, self.ps, cacheable)
        found = (self.client.match_prefix(keys, adopt=True).tolist()
                 if keys else [])
        publishable = cacheable - len(found)
        fresh = []
        if publishable:
            allocation = self.client.alloc([publishable * self.ps],
                                           return_inline=True)
            if allocation.ok:
                fresh = (np.asarray(allocation.slots)[::self.ps] //
                         self.ps).tolist()
            self.client.release(allocation)
            if not fresh:
                self._drop(found)
                return None
        own = self._own(pages - len(found) - len(fresh))
        if own is None:
            self._drop(found + fresh)
            return None
        self.lookups += len(keys)
        self.hits += len(found)
        return dict(pages=found + fresh + own, cached_tokens=len(found) *
                    self.ps, keys=keys, found=found, fresh=fresh, own=own)

    def _drop(self, pages):
        if pages:
            self.client.free_pages(np.asarray(pages, dtype=np.int64))

    def computed(self, request, grant):
        """The prompt's K/V is written (the caller synchronized the
        device): publish the pages it computed."""
        if grant["fresh"]:
            start = len(grant["found"])
            self.client.publish(np.asarray(grant["fresh"], dtype=np.int64),
                                grant["keys"][start:],
                                parent_key=grant["keys"][start - 1]
                                if start else None)

    def finish(self, grant):
        # Adopted and published pages drop this request's reference (a
        # duplicate whose key another replica published first is freed).
        self._drop(grant["found"] + grant["fresh"])
        self._free_own(grant["own"])


# --------------------------------------------------------------- replica

def run_replica(rank, args, setup, num_replicas, requests, results):
    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" \
        else "cpu"
    if args.stagger_s:
        time.sleep(rank * args.stagger_s)
    client = None
    if setup == "split":
        pool = SplitPool(args, args.num_pages // num_replicas, device)
    else:
        import pagealloc
        client = pagealloc.Client.connect(args.target,
                                          name="replica-%d" % rank)
        pool = (SharedPool if setup == "shared" else SharedPrefixPool)(
            args, client, device)
    model = TinyDecoder(args, device, compute_dtype(args, device))
    ps = args.page_size
    waiting = collections.deque(requests)
    running = []
    done = {}
    ttft, tpot = [], []
    peak = 0
    start_time = time.perf_counter()
    while waiting or running:
        if not running and waiting:
            # Idle until the next request arrives.
            wait = start_time + waiting[0]["arrival"] - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        # Admit what fits and has arrived: every page of the request's
        # whole length.
        now = time.perf_counter()
        while waiting and len(running) < args.max_running:
            request = waiting[0]
            if start_time + request["arrival"] > now:
                break
            length = len(request["prompt"]) + args.new_tokens
            grant = pool.admit(request, -(-length // ps))
            if grant is None:
                break
            waiting.popleft()
            slots = (np.asarray(grant["pages"], dtype=np.int64)[:, None] *
                     ps + np.arange(ps)).reshape(-1)
            running.append(dict(request=request, grant=grant, slots=slots,
                                tokens=list(request["prompt"]),
                                done_to=grant["cached_tokens"], out=[],
                                arrived=start_time + request["arrival"],
                                last=None))
        if not running:
            if setup == "split" or not waiting:
                raise SystemExit("replica %d: a request does not fit an "
                                 "empty pool" % rank)
            # The shared pool is the other replicas' now (one that started
            # first may hold it all): wait for them to free pages.
            time.sleep(0.001)
            continue
        peak = max(peak, len(running))
        # One step: a forward over every prefill chunk and one over every
        # decode (apart, so that a decode is not padded to a chunk's
        # length), then the step's tokens to the host at once.
        prefills, decodes = [], []
        for r in running:
            prompt = len(r["request"]["prompt"])
            if r["done_to"] < prompt:
                end = min(prompt, r["done_to"] + args.prefill_chunk)
                prefills.append((r, end))
            else:
                decodes.append((r, len(r["tokens"])))
        groups = [g for g in (prefills, decodes) if g]
        # Every input is on the device before the first forward is queued.
        batches = [model.batch([(r["tokens"], r["done_to"], end, r["slots"])
                                for r, end in g]) for g in groups]
        tokens = torch.cat([model.forward_batch(pool.kv, batch)
                            for batch in batches]).tolist()
        if device == "cuda":
            # tolist() waited for this stream; publishing needs the K/V
            # written whatever stream wrote it.
            torch.cuda.synchronize()
        stepped = []
        for (r, end), token in zip(prefills + decodes, tokens):
            prompt = len(r["request"]["prompt"])
            r["done_to"] = end
            if end >= prompt:   # the prompt's last chunk, or a decode
                stepped.append((r, token))
        now = time.perf_counter()
        for r, token in stepped:
            if not r["out"]:
                ttft.append(now - r["arrived"])
                pool.computed(r["request"], r["grant"])
            else:
                tpot.append(now - r["last"])
            r["last"] = now
            r["out"].append(token)
            r["tokens"].append(token)
        still = []
        for r in running:
            if len(r["out"]) >= args.new_tokens:
                pool.finish(r["grant"])
                done[r["request"]["id"]] = r["out"]
            else:
                still.append(r)
        running = still
    elapsed = time.perf_counter() - start_time
    pool.close()
    if client is not None:
        client.close()
    results.put(dict(rank=rank, outputs=done, elapsed_s=elapsed, ttft=ttft,
                     tpot=tpot, peak=peak, lookups=pool.lookups,
                     hits=pool.hits, device=device))


def run(args, setup, num_replicas, requests):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    shares = [requests[r::num_replicas] for r in range(num_replicas)]
    procs = [ctx.Process(target=run_replica,
                         args=(r, args, setup, num_replicas, shares[r],
                               results))
             for r in range(num_replicas)]
    for p in procs:
        p.start()
    rows = []
    deadline = time.monotonic() + args.timeout_s
    while len(rows) < num_replicas:
        try:
            rows.append(results.get(timeout=1))
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise SystemExit("%s x%d: a replica failed (exit %s)" %
                                 (setup, num_replicas, failed or "timeout"))
    for p in procs:
        p.join()
    return rows


def summarize(setup, num_replicas, rows, args):
    def pct(values, q):
        return float(np.percentile(values, q)) * 1e3 if values else 0.0
    ttft = sum((r["ttft"] for r in rows), [])
    tpot = sum((r["tpot"] for r in rows), [])
    elapsed = max(r["elapsed_s"] for r in rows) + (
        (num_replicas - 1) * args.stagger_s)
    lookups = sum(r["lookups"] for r in rows)
    outputs = {}
    for r in rows:
        outputs.update(r["outputs"])
    return dict(
        setup=setup, replicas=num_replicas, device=rows[0]["device"],
        requests=len(outputs),
        requests_per_s=len(outputs) / elapsed,
        tokens_per_s=len(outputs) * args.new_tokens / elapsed,
        ttft_ms_p50=pct(ttft, 50), ttft_ms_p99=pct(ttft, 99),
        tpot_ms_p50=pct(tpot, 50), tpot_ms_p99=pct(tpot, 99),
        peak_sequences_max=max(r["peak"] for r in rows),
        peak_sequences_min=min(r["peak"] for r in rows),
        prefix_hit_rate=(sum(r["hits"] for r in rows) / lookups
                         if lookups else 0.0),
        kv_reused_mib=sum(r["hits"] for r in rows) * page_kv_bytes(args) /
        2**20,
        outputs=outputs)


def page_kv_bytes(args):
    """Bytes of one page's K and V over every layer."""
    element = torch.empty((), dtype=kv_dtype(args)).element_size()
    return (2 * args.layers * args.page_size * args.kv_heads *
            args.head_dim * element)


def parser():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", default=os.environ.get("PAGEALLOC_TARGET"))
    p.add_argument("--setups", default=",".join(SETUPS))
    p.add_argument("--replicas", default="1,2,3")
    p.add_argument("--device", default="auto", choices=("auto", "cpu"))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv_heads", type=int, default=2)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--max_len", type=int, default=4096)
    p.add_argument("--kv_dtype", default="fp16",
                   choices=("fp32", "fp16", "bf16"))
    p.add_argument("--compute_dtype", default="",
                   help="float64, float32, bfloat16 (default: bfloat16 on "
                   "CUDA, float64 on the CPU)")
    p.add_argument("--page_size", type=int, default=16)
    p.add_argument("--num_pages", type=int, default=4096)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--system_prompts", type=int, default=4)
    p.add_argument("--system_tokens", type=int, default=1024)
    p.add_argument("--suffix_tokens", type=int, nargs=2, default=(32, 256))
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--prefill_chunk", type=int, default=512)
    p.add_argument("--max_running", type=int, default=256)
    p.add_argument("--stagger_s", type=float, default=0.0)
    p.add_argument("--arrival_rate", type=float, default=0.0,
                   help="requests a second over all replicas, a seeded "
                   "Poisson stream (0: every request there at the start)")
    p.add_argument("--warmup_requests", type=int, default=8,
                   help="on CUDA, each set-up first serves this many "
                   "requests with one replica, untimed (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout_s", type=float, default=3600)
    p.add_argument("--check", action="store_true",
                   help="compare every request's tokens with the "
                   "single-process reference")
    p.add_argument("--print_daemon_flags", action="store_true")
    p.add_argument("--json")
    p.add_argument("--plot", help="draws tokens/s and peak sequences by "
                   "replicas for each set-up into this .svg or .png, with "
                   "gnuplot where installed")
    p.add_argument("--plot_from", help="with --plot: the rows of an earlier "
                   "run's --json, drawn without running anything")
    return p


def daemon_flags(args):
    return ["--semantics=sglang", "--page_size=%d" % args.page_size,
            "--num_pages=%d" % args.num_pages,
            "--kv_layout=mha:layers=%d,kv_heads=%d,head_dim=%d,dtype=%s" % (
                args.layers, args.kv_heads, args.head_dim, args.kv_dtype)]


def plot(table, path, title):
    """Draws `table`'s tokens/s and peak sequences (the busiest replica's)
    by replica count, a line per set-up, into `path` (.svg or .png) with
    gnuplot. Returns False, drawing nothing, where gnuplot is missing."""
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("--plot: gnuplot is not installed; nothing drawn")
        return False
    terminal = ("pngcairo size 960,420" if path.endswith(".png") else
                "svg size 960,420 dynamic")
    setups = [s for s in SETUPS if any(r["setup"] == s for r in table)]

    def data(field):
        blocks = []
        for setup in setups:
            rows = sorted((r for r in table if r["setup"] == setup),
                          key=lambda r: r["replicas"])
            blocks.append("\n".join("%d %g" % (r["replicas"], r[field])
                                    for r in rows) + "\ne")
        return "\n".join(blocks)

    def curves():
        return ", ".join("'-' using 1:2 with linespoints lw 2 title '%s'" %
                         setup for setup in setups)
    script = "\n".join([
        "set terminal %s" % terminal, "set termoption noenhanced",
        "set output '%s'" % path.replace("'", ""),
        "set multiplot layout 1,2 title '%s'" % title.replace("'", ""),
        "set xlabel 'replicas on one GPU'", "set xtics 1", "set grid",
        "set key top left", "set yrange [0:*]",
        "set ylabel 'output tokens/s'",
        "plot " + curves(), data("tokens_per_s"),
        "set ylabel 'peak sequences, busiest replica'",
        "set key bottom left",
        "plot " + curves(), data("peak_sequences_max"),
        "unset multiplot", ""])
    subprocess.run([gnuplot], input=script, text=True, check=True)
    return True


def main(argv=None):
    args = parser().parse_args(argv)
    if args.print_daemon_flags:
        print(" ".join(daemon_flags(args)))
        return []
    if args.plot_from:
        if not args.plot:
            raise SystemExit("--plot_from needs --plot")
        with open(args.plot_from) as f:
            table = json.load(f)
        plot(table, args.plot, "multi_replica_bench (%s)" %
             os.path.basename(args.plot_from))
        return table
    setups = args.setups.split(",")
    for setup in setups:
        if setup not in SETUPS:
            raise SystemExit("--setups: %r is none of %s" % (setup, SETUPS))
        if setup != "split" and not args.target:
            raise SystemExit("--target (or PAGEALLOC_TARGET) is needed for "
                             "%s" % setup)
    requests = make_requests(args)
    reference = reference_outputs(args, requests) if args.check else None
    table = []
    if (args.warmup_requests > 0 and args.device != "cpu" and
            torch.cuda.is_available()):
        # The first run of a set-up pays for CUDA's and the daemon's first
        # use (contexts, modules, the slab's mapping): not the set-up's.
        warm = [dict(r, arrival=0.0) for r in requests[:args.warmup_requests]]
        for setup in setups:
            run(args, setup, 1, warm)
    for num_replicas in [int(n) for n in args.replicas.split(",")]:
        for setup in setups:
            if setup == "shared-prefix":
                # Each run starts from an empty cache: what it hits, its
                # own replicas published.
                import pagealloc
                pagealloc.reset_prefix_cache(args.target)
            row = summarize(setup, num_replicas,
                            run(args, setup, num_replicas, requests), args)
            if reference is not None:
                row["mismatches"] = sorted(
                    i for i, want in reference.items()
                    if row["outputs"].get(i) != want)
            table.append(row)
            print(json.dumps({k: v for k, v in row.items()
                              if k != "outputs"}), flush=True)
    print()
    print("| set-up | replicas | requests/s | tokens/s | TTFT p50 / p99 ms | "
          "TPOT p50 / p99 ms | peak sequences (max / min replica) | "
          "prefix hit rate | KV reused (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print("| %s | %d | %.2f | %.1f | %.1f / %.1f | %.2f / %.2f | %d / %d "
              "| %.2f | %.1f |" % (
                  r["setup"], r["replicas"], r["requests_per_s"],
                  r["tokens_per_s"], r["ttft_ms_p50"], r["ttft_ms_p99"],
                  r["tpot_ms_p50"], r["tpot_ms_p99"],
                  r["peak_sequences_max"], r["peak_sequences_min"],
                  r["prefix_hit_rate"], r["kv_reused_mib"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    if args.plot:
        plot(table, args.plot, "multi_replica_bench on %s" % (
            table[0]["device"] if table else "-"))
    return table


if __name__ == "__main__":
    main()

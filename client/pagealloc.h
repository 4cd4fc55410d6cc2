/*
 * pagealloc.h: the C ABI of the pagealloc client library,
 * libpagealloc_client.so.
 *
 * What Python (ctypes), Rust, Go and C++ programs outside Bazel bind to. It
 * wraps pagealloc::Client (client/client.h) one call for one call: the same
 * sessions, leases, fast channel, rings and errors. The header is C89 and
 * C99 (and C++) and names no C++ type; the library exports only the
 * `pagealloc_*` symbols below.
 *
 *   pagealloc_client_options options;
 *   pagealloc_client* client;
 *   pagealloc_allocation* allocation;
 *   const pagealloc_allocation_view* view;
 *   pagealloc_error error;
 *   pagealloc_client_options_init(&options, sizeof(options));
 *   options.target = "unix:///run/pagealloc/gpu0.sock";
 *   options.client_name = "scheduler-tp0";
 *   if (pagealloc_connect(&options, &client, &error) != PAGEALLOC_OK) {
 *     fprintf(stderr, "%s: %s\n", pagealloc_status_code_name(error.code),
 *             error.message);
 *   }
 *   pagealloc_alloc_decode(client, seq_lens, n, last_locs, n, NULL,
 *                          &allocation, &error);
 *   view = pagealloc_allocation_get_view(allocation);
 *   ... view->slots[i]: view->counts[i] slots of request i ...
 *   pagealloc_release(client, allocation);  (the ring space may be reused)
 *   pagealloc_allocation_destroy(allocation);
 *   pagealloc_client_destroy(client);       (closes the session)
 *
 * Errors. Every call that can fail returns a pagealloc_status_code:
 * PAGEALLOC_OK (0) or the canonical code (absl::StatusCode and
 * grpc::StatusCode share these numbers). When it fails and `error` is not
 * NULL, `*error` receives the code and the message (the daemon's own for
 * its refusals), NUL-terminated and cut at PAGEALLOC_ERROR_MESSAGE_BYTES - 1
 * bytes. The error is an explicit out-parameter rather than a thread-local
 * "last error" so that a binding that hops threads between two calls (Go's
 * goroutines, Python's GIL released around a call) still reads the error of
 * its own call. A call that succeeds leaves `*error` untouched.
 * Per-request refusals inside an allocation call (e.g. RESOURCE_EXHAUSTED
 * for a request the pool cannot serve) are not call failures: the call
 * returns PAGEALLOC_OK and the view's codes/messages say which requests were
 * refused and why.
 *
 * Structures. Those the caller fills (options) start with `struct_size`,
 * set by their _init function: the library reads only the fields that fit
 * in it, so a program built against this header keeps working with a later
 * library that appends fields (and a later program with this library, as
 * long as it leaves the fields this library does not know zero). Those the
 * library fills in the caller's memory (pagealloc_stats) take the same
 * `struct_size`; the library writes at most that many bytes. Those the library
 * owns (the allocation view) are read through a pointer and only ever grow at
 * the end.
 *
 * Threads. A pagealloc_client may be used from several threads at once (as
 * pagealloc::Client). An allocation handle is immutable: read it from any
 * thread; destroy it once.
 *
 * Lifetimes. An allocation's ring slots stay valid (the daemon does not
 * write there) until the allocation, or any later one, is released with
 * pagealloc_release; after that the daemon may write new slots there.
 * Destroying an allocation handle does not release its ring space, and
 * releasing does not destroy the handle. Inline results (return_inline)
 * live in the handle and stay valid until it is destroyed. Destroying a
 * client unmaps its ring: its allocations' ring slots go with it (their
 * handles may still be destroyed afterwards).
 */

#ifndef PAGEALLOC_CLIENT_PAGEALLOC_H_
#define PAGEALLOC_CLIENT_PAGEALLOC_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes. The major number changes when a function,
 * a structure's existing field or a meaning changes incompatibly; the minor
 * number when something is added. A binding checks the major number of
 * pagealloc_abi_version() against the one it was written for, and the
 * minor number against the one that added what it calls (marked "ABI 1.1"
 * below: the SGLang-exactness calls, the admin calls, the KV buffers and
 * the completion value). A program built against ABI 1.0 runs unchanged
 * on a 1.1 library. */
#define PAGEALLOC_ABI_VERSION_MAJOR 1
#define PAGEALLOC_ABI_VERSION_MINOR 11
#define PAGEALLOC_ABI_VERSION \
  ((PAGEALLOC_ABI_VERSION_MAJOR << 16) | PAGEALLOC_ABI_VERSION_MINOR)

/* The library's ABI version, PAGEALLOC_ABI_VERSION as it was built. */
uint32_t pagealloc_abi_version(void);

/* The library's release version ("0.1.0"), a static string. */
const char* pagealloc_version(void);

/* ------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------ */

/* The canonical status codes, numbered as absl::StatusCode and gRPC's. */
typedef enum pagealloc_status_code {
  PAGEALLOC_OK = 0,
  PAGEALLOC_CANCELLED = 1,
  PAGEALLOC_UNKNOWN = 2,
  PAGEALLOC_INVALID_ARGUMENT = 3,
  PAGEALLOC_DEADLINE_EXCEEDED = 4,
  PAGEALLOC_NOT_FOUND = 5,
  PAGEALLOC_ALREADY_EXISTS = 6,
  PAGEALLOC_PERMISSION_DENIED = 7,
  PAGEALLOC_RESOURCE_EXHAUSTED = 8,
  PAGEALLOC_FAILED_PRECONDITION = 9,
  PAGEALLOC_ABORTED = 10,
  PAGEALLOC_OUT_OF_RANGE = 11,
  PAGEALLOC_UNIMPLEMENTED = 12,
  PAGEALLOC_INTERNAL = 13,
  PAGEALLOC_UNAVAILABLE = 14,
  PAGEALLOC_DATA_LOSS = 15,
  PAGEALLOC_UNAUTHENTICATED = 16
} pagealloc_status_code;

/* The code's name as gRPC spells it ("RESOURCE_EXHAUSTED"), a static
 * string; "UNKNOWN_CODE" for a number outside 0..16. */
const char* pagealloc_status_code_name(int32_t code);

#define PAGEALLOC_ERROR_MESSAGE_BYTES 1024

/* Why a call failed. */
typedef struct pagealloc_error {
  int32_t code; /* a pagealloc_status_code, never PAGEALLOC_OK */
  /* NUL-terminated; cut (ending in "...") when longer than the buffer. */
  char message[PAGEALLOC_ERROR_MESSAGE_BYTES];
} pagealloc_error;

/* ------------------------------------------------------------------------
 * Sessions
 * ------------------------------------------------------------------------ */

typedef struct pagealloc_client pagealloc_client;

/* pagealloc::ClientOptions. Strings are copied by pagealloc_connect. */
typedef struct pagealloc_client_options {
  size_t struct_size; /* sizeof(pagealloc_client_options) */
  /* gRPC target: "unix:///run/pagealloc/gpu0.sock" or "host:port". NULL or
   * "": GPU 0's daemon where pagealloc-server listens by default
   * (/run/pagealloc, then $XDG_RUNTIME_DIR/pagealloc); UNAVAILABLE, naming
   * the paths looked at, when no socket is there. */
  const char* target;
  /* Shown in the daemon's logs and metrics (NULL: ""). */
  const char* client_name;
  /* Output ring size in slots (0: the daemon's default). */
  int64_t ring_capacity_slots;
  /* Most pages this session may own (0: the daemon's cap, if any). */
  int64_t quota_pages;
  /* How often to renew the lease, in ms (0: a third of the lease). */
  int64_t keepalive_interval_ms;
  /* Deadline of each call, in ms (default 30000). */
  int64_t call_timeout_ms;
  /* Nonzero (default): use the session's fast channel when the daemon
   * offers one and its memory socket is in reach. */
  int32_t fast_channel;
  int32_t reserved0; /* zero */
  /* How long a fast call spins for its answer before it sleeps, in
   * microseconds (default 500). */
  int64_t fast_channel_spin_us;
  /* ABI 1.1. The pool's Register secret, when its daemon runs with
   * --register_secret_file: `register_secret_length` bytes (NULL: none). */
  const char* register_secret;
  size_t register_secret_length;
  /* ABI 1.1. Nonzero (default): map the pool's KV slab when the daemon owns
   * the KV memory (pagealloc_kv_buffer_count); connecting fails when it
   * cannot. Zero: a tool that only allocates does without. */
  int32_t map_kv_slab;
  int32_t reserved1; /* zero */
  /* ABI 1.7. Nonzero: register the session resumable (RegisterRequest.
   * resumable): when this process dies, or pagealloc_detach lets go, the
   * daemon keeps the session until its lease runs out, for pagealloc_resume
   * from another process. Default 0: its pages go back at once. */
  int32_t resumable;
  int32_t reserved2; /* zero */
  /* ABI 1.7. Reconnect after the daemon's death (pagealloc::ClientOptions,
   * client/client.h "Reconnect"): how long to try to Resume the session
   * from a restarted daemon, in ms. 0: off (the session is gone when the
   * daemon dies); positive: at most this long; -1 (default): for the
   * daemon's lease when it advertises that it keeps its state across
   * restarts, else off. Between attempts the client waits from
   * reconnect_initial_backoff_ms (default 50), doubling, up to
   * reconnect_max_backoff_ms (default 1000). */
  int64_t reconnect_timeout_ms;
  int64_t reconnect_initial_backoff_ms;
  int64_t reconnect_max_backoff_ms;
} pagealloc_client_options;

/* Fills the first `struct_size` bytes of `options` with the defaults and
 * sets options->struct_size; pass sizeof(*options), so that a program built
 * against an older header is never written past its structure. */
void pagealloc_client_options_init(pagealloc_client_options* options,
                                   size_t struct_size);

/* Connects to the daemon at options->target, registers a session, maps its
 * output ring and starts keeping its lease (pagealloc::Client::Connect).
 * On success `*client` is the new session's handle. Fails with the daemon's
 * status: UNAVAILABLE when nothing listens at the target, UNAUTHENTICATED
 * when its memory socket refuses the session, FAILED_PRECONDITION when a
 * CPU daemon's ring cannot be mapped (a client on another host),
 * INVALID_ARGUMENT for missing or malformed options. */
int32_t pagealloc_connect(const pagealloc_client_options* options,
                          pagealloc_client** client, pagealloc_error* error);

/* ABI 1.7. Takes back the live session `session_id` (its token:
 * `token_length` bytes) instead of registering one
 * (pagealloc::Client::Resume): a scheduler restarted within its lease, a
 * tool acting for a session. The session keeps its pages, checkpoints and
 * quota; its output ring and fast channel are new. From `options`: the
 * target, ring_capacity_slots, fast_channel, the register secret, the
 * timeouts and reconnect (client_name, quota_pages and resumable are the
 * session's own). Fails with NOT_FOUND (unknown, expired, or reclaimed: a
 * session that was not resumable went with its process), UNAUTHENTICATED
 * (token, register secret), FAILED_PRECONDITION while another process holds
 * the session's memory socket connection, unless `take_over` is nonzero
 * (that process is then told its session was taken), and as
 * pagealloc_connect. */
int32_t pagealloc_resume(const pagealloc_client_options* options,
                         uint64_t session_id, const char* token,
                         size_t token_length, int32_t take_over,
                         pagealloc_client** client, pagealloc_error* error);

/* Ends the session now; on success the daemon has freed its pages. Later
 * calls fail with FAILED_PRECONDITION. The handle, its mapped ring and its
 * allocations stay valid until destroyed. Closing twice is OK. */
int32_t pagealloc_close(pagealloc_client* client, pagealloc_error* error);

/* ABI 1.7. Lets go of a resumable session without ending it (Client::
 * Detach): stops renewing its lease and closes its memory socket
 * connection, so that the daemon keeps it until the lease runs out, for
 * pagealloc_resume. Later calls fail with FAILED_PRECONDITION; destroying
 * the handle then leaves the session alone. FAILED_PRECONDITION for a
 * session that is not resumable or is gone. */
int32_t pagealloc_detach(pagealloc_client* client, pagealloc_error* error);

/* ABI 1.7. Nonzero when the session is resumable. */
int32_t pagealloc_session_resumable(const pagealloc_client* client);

/* ABI 1.7. The client's link to the daemon: 0 for the session's first
 * (pagealloc_connect's or pagealloc_resume's), one more after each
 * reconnect; a view's link_epoch says which one answered it. And nonzero
 * while a reconnect is under way (calls wait for it, up to their timeout).
 * After a reconnect pagealloc_ring describes the new ring; every earlier
 * ring stays mapped until the handle is destroyed, so earlier allocations'
 * slots stay readable. */
uint64_t pagealloc_link_epoch(const pagealloc_client* client);
int32_t pagealloc_reconnecting(const pagealloc_client* client);

/* ABI 1.9. The calls this handle sent again after the daemon restarted
 * under them. Every call that changes the session's pages carries a call
 * id (allocations, frees, checkpoints, rollbacks, clears): one in flight
 * when the daemon died is sent again with its id once the client has
 * resumed, and the restarted daemon answers it once, whether or not it
 * took effect before the death (docs/design.md, "Retries by call id").
 * Such a call fails only when the daemon cannot tell (PAGEALLOC_ABORTED:
 * a later call of the session took effect first, or the daemon keeps its
 * state in a format without call ids). */
uint64_t pagealloc_calls_sent_again(const pagealloc_client* client);

/* Closes the session (unless closed or lost), unmaps its ring and frees
 * the handle. NULL is ignored. */
void pagealloc_client_destroy(pagealloc_client* client);

/* OK while the session lives; else why it is gone (closed: FAILED_
 * PRECONDITION; lease lost or daemon gone: NOT_FOUND, UNAVAILABLE ...):
 * the slots and pages it held are void. */
int32_t pagealloc_session_status(const pagealloc_client* client,
                                 pagealloc_error* error);

uint64_t pagealloc_session_id(const pagealloc_client* client);

/* The session's secret, `*length` bytes (not NUL-terminated in general),
 * valid while the handle lives. Hand it only to tools acting for this
 * session (pagealloc-cli free --session_file). */
const char* pagealloc_session_token(const pagealloc_client* client,
                                    size_t* length);

/* The lease the daemon granted, in ms. */
int64_t pagealloc_lease_ms(const pagealloc_client* client);

/* Nonzero when allocation calls go through the fast channel. */
int32_t pagealloc_uses_fast_channel(const pagealloc_client* client);

typedef enum pagealloc_backend {
  PAGEALLOC_BACKEND_UNSPECIFIED = 0,
  PAGEALLOC_BACKEND_CPU = 1,
  PAGEALLOC_BACKEND_CUDA = 2
} pagealloc_backend;

/* The pool as Register described it (v1::PoolInfo). */
typedef struct pagealloc_pool_info {
  int64_t page_size;
  int64_t num_pages;    /* usable pages, ids 1..num_pages */
  int32_t backend;      /* a pagealloc_backend */
  int32_t gpu;          /* CUDA device ordinal (CUDA backend) */
  char device_uuid[64]; /* NUL-terminated; "" on the CPU backend */
  char free_policy[16]; /* "lifo" or "sorted" */
} pagealloc_pool_info;

/* Copies the session's pool description into `*pool`. */
void pagealloc_pool(const pagealloc_client* client, pagealloc_pool_info* pool);

/* ABI 1.1. The pool's semantics profile (the daemon's --semantics):
 * "pagealloc" (its own contract) or "sglang" (SGLang's allocators where
 * they differ: docs/design.md section 10). Valid while the handle lives;
 * "" for a NULL client. */
const char* pagealloc_pool_semantics(const pagealloc_client* client);

/* The session's mapped output ring: `*capacity_slots` int64 slots from the
 * returned address, a device pointer when `*on_device` is nonzero (CUDA
 * backend), else a read-only host mapping. Every ring result of an
 * allocation lies inside it. Any out-pointer may be NULL. */
const int64_t* pagealloc_ring(const pagealloc_client* client,
                              int64_t* capacity_slots, int32_t* on_device);

/* ------------------------------------------------------------------------
 * Allocation
 * ------------------------------------------------------------------------ */

typedef struct pagealloc_allocation pagealloc_allocation;

/* pagealloc::CallOptions. NULL options mean the defaults. */
typedef struct pagealloc_call_options {
  size_t struct_size; /* sizeof(pagealloc_call_options) */
  /* Nonzero: slots in host memory owned by the allocation handle instead
   * of the ring (always through gRPC). */
  int32_t return_inline;
  /* Nonzero: the daemon answers right after its launch (CUDA backend); the
   * slots are written when the daemon's completion event fires: order a
   * stream after it with pagealloc_order_after_completion before reading
   * them. Same as a synchronous call on the CPU backend. */
  int32_t async_completion;
  /* Pages freed first, as part of the same call (as pagealloc_free_pages);
   * when that free is refused the call fails as a whole and nothing
   * changes. Read during the call only. */
  const int64_t* free_pages_first;
  size_t num_free_pages_first;
  /* Nonzero: take a checkpoint after the free and before allocating. */
  int32_t checkpoint_first;
  int32_t reserved0; /* zero */
  /* ABI 1.1. Nonzero: admit every request of the call or none. When one
   * does not fit, each request is refused with RESOURCE_EXHAUSTED and the
   * pool is left as it was (SGLang's alloc_extend / alloc_decode returning
   * None); the call itself still succeeds. */
  int32_t all_or_nothing;
  int32_t reserved1; /* zero */
} pagealloc_call_options;

/* As pagealloc_client_options_init: pass sizeof(*options). */
void pagealloc_call_options_init(pagealloc_call_options* options,
                                 size_t struct_size);

/* One allocation call's results, owned by its handle (struct-of-arrays:
 * each array has num_requests entries). */
typedef struct pagealloc_allocation_view {
  int64_t num_requests;
  /* 0 when request i got its slots, else the code it was refused with
   * (e.g. RESOURCE_EXHAUSTED: the pool or the session's quota is short);
   * a refused request changed nothing. */
  const int32_t* codes;
  /* Request i's slots: counts[i] int64 slot indices, into the mapped ring
   * (a device pointer when on_device) or into the handle's host storage
   * (inline results); NULL when refused. One call's accepted requests lie
   * one after another in request order. */
  const int64_t* const* slots;
  const int64_t* counts;
  const int64_t* new_pages; /* pages request i was given */
  /* NUL-terminated; "" for an accepted request. */
  const char* const* messages;
  /* Ring position after this call's region (0 for inline results): what
   * pagealloc_release releases up to. */
  int64_t ring_end;
  /* Pages freed by free_pages_first. */
  int64_t pages_freed_first;
  /* Requests in the daemon's launch that carried this call. */
  int32_t batch_requests;
  /* Nonzero when the slots are device pointers (CUDA ring). */
  int32_t on_device;
  /* Requests refused (codes[i] != 0). */
  int64_t num_refused;
  /* The accepted requests' slots as one run of `num_slots` slots, when they
   * lie one after another in memory: always when no request was refused,
   * and for inline results. Else num_slots is -1 and all_slots NULL (a
   * refused request keeps its place in the ring). NULL too when the run
   * is empty. */
  const int64_t* all_slots;
  int64_t num_slots;
  /* ABI 1.1. The value the pool's completion counter reaches once this
   * call's slots are written (pagealloc_order_after waits for it on the
   * CUDA backend). The counter only grows; on the CPU backend it numbers
   * the launches and nothing waits on it. */
  uint64_t completion_value;
  /* ABI 1.7. The link to the daemon that answered (pagealloc_link_epoch):
   * ring_end counts within one link; releasing an allocation of an earlier
   * link releases nothing (its ring went with that link), and
   * pagealloc_order_after refuses it (FAILED_PRECONDITION). */
  uint64_t link_epoch;
} pagealloc_allocation_view;

/* The allocation calls. Each parallel array comes with its own length; the
 * daemon refuses lengths that differ (INVALID_ARGUMENT, naming them). A
 * call fails as a whole (no handle) for a bad argument, an unknown or
 * closed session, a full ring or a transport error; per-request refusals
 * are in the view. On success `*allocation` is a new handle.
 * Extend: per request (prefix_len, seq_len, last_loc) (docs/design.md
 * section 2). */
int32_t pagealloc_alloc_extend(pagealloc_client* client,
                               const int64_t* prefix_lens,
                               size_t num_prefix_lens, const int64_t* seq_lens,
                               size_t num_seq_lens, const int64_t* last_locs,
                               size_t num_last_locs,
                               const pagealloc_call_options* options,
                               pagealloc_allocation** allocation,
                               pagealloc_error* error);

/* Decode: one token per request (prefix_len = seq_len - 1). */
int32_t pagealloc_alloc_decode(pagealloc_client* client,
                               const int64_t* seq_lens, size_t num_seq_lens,
                               const int64_t* last_locs, size_t num_last_locs,
                               const pagealloc_call_options* options,
                               pagealloc_allocation** allocation,
                               pagealloc_error* error);

/* Whole pages: num_tokens[i] a multiple of the page size. */
int32_t pagealloc_alloc(pagealloc_client* client, const int64_t* num_tokens,
                        size_t num_requests,
                        const pagealloc_call_options* options,
                        pagealloc_allocation** allocation,
                        pagealloc_error* error);

/* The handle's results; valid until the handle is destroyed. */
const pagealloc_allocation_view* pagealloc_allocation_get_view(
    const pagealloc_allocation* allocation);

/* OK when every request was served; else the first refusal's code and
 * message. */
int32_t pagealloc_allocation_status(const pagealloc_allocation* allocation,
                                    pagealloc_error* error);

/* Frees the handle (and inline results); the ring space stays reserved
 * until released. NULL is ignored. */
void pagealloc_allocation_destroy(pagealloc_allocation* allocation);

/* Lets the daemon reuse the ring space of `allocation` and of every
 * allocation before it. Sent with the next allocation call, or now by
 * pagealloc_flush_release. */
void pagealloc_release(pagealloc_client* client,
                       const pagealloc_allocation* allocation);
int32_t pagealloc_flush_release(pagealloc_client* client,
                                pagealloc_error* error);

/* Makes `cuda_stream` (a cudaStream_t; NULL is the legacy default stream)
 * wait, without a host synchronisation, until the daemon's launches so far
 * have written their slots: what a consumer of async_completion results
 * calls before using them. A no-op on the CPU backend; FAILED_PRECONDITION
 * when the library was built without CUDA and the pool is on a GPU. */
int32_t pagealloc_order_after_completion(const pagealloc_client* client,
                                         void* cuda_stream,
                                         pagealloc_error* error);

/* ABI 1.1. Makes `cuda_stream` wait, on the GPU and without a host
 * synchronisation, until the launch that wrote `allocation`'s slots is done
 * (the pool's completion counter reaching the view's completion_value):
 * work queued on the stream afterwards may read them. A no-op on the CPU
 * backend and for inline results; INTERNAL when CUDA refuses the wait. */
int32_t pagealloc_order_after(const pagealloc_client* client,
                              const pagealloc_allocation* allocation,
                              void* cuda_stream, pagealloc_error* error);

/* Copies `count` slots at `slots` (from a view: ring or inline) into host
 * memory at `out`. */
int32_t pagealloc_copy_to_host(const pagealloc_client* client,
                               const int64_t* slots, int64_t count,
                               int64_t* out, pagealloc_error* error);

/* ------------------------------------------------------------------------
 * Free, checkpoints
 * ------------------------------------------------------------------------ */

/* Frees the distinct pages of `slots` / the `pages` (all or nothing; a
 * double free is FAILED_PRECONDITION, another session's page
 * PERMISSION_DENIED, page 0 or out of range INVALID_ARGUMENT). A free group
 * (SGLang's free_group_begin/end) is one call of this with the group's
 * slots collected. `*pages_freed` (may be NULL) receives the pages freed. */
int32_t pagealloc_free_slots(pagealloc_client* client, const int64_t* slots,
                             size_t num_slots, int64_t* pages_freed,
                             pagealloc_error* error);
int32_t pagealloc_free_pages(pagealloc_client* client, const int64_t* pages,
                             size_t num_pages, int64_t* pages_freed,
                             pagealloc_error* error);

/* ABI 1.1. Where freed pages go back in the free list (v1::FreeOrder). */
typedef enum pagealloc_free_order {
  /* The pool's: ascending for slots under --semantics=sglang with a page
   * size above 1 (SGLang's free), first appearance otherwise. */
  PAGEALLOC_FREE_ORDER_DEFAULT = 0,
  /* Ascending page ids (SGLang's free: torch.unique(slots // page_size)). */
  PAGEALLOC_FREE_ORDER_ASCENDING = 1,
  /* In order of first appearance (SGLang's free_segment). */
  PAGEALLOC_FREE_ORDER_FIRST_APPEARANCE = 2
} pagealloc_free_order;

/* ABI 1.1. pagealloc_free_slots / pagealloc_free_pages putting the pages
 * back in `order` (a pagealloc_free_order; INVALID_ARGUMENT for another
 * number). */
int32_t pagealloc_free_slots_in_order(pagealloc_client* client,
                                      const int64_t* slots, size_t num_slots,
                                      int32_t order, int64_t* pages_freed,
                                      pagealloc_error* error);
int32_t pagealloc_free_pages_in_order(pagealloc_client* client,
                                      const int64_t* pages, size_t num_pages,
                                      int32_t order, int64_t* pages_freed,
                                      pagealloc_error* error);

/* ABI 1.3. The release fence (docs/design.md section 6, "The release
 * fence"): frees ordered after the GPU work that reads the pages, without a
 * host sync. The frees above are ordered as the host calls them (right for
 * a caller that synchronized, and for the CPU backend).
 *
 * pagealloc_queue_release queues on `cuda_stream` (a cudaStream_t; NULL:
 * the legacy default stream) the write of the session's next release value
 * to its release word, behind the work queued there, and stores the value
 * in `*release_value` (may be NULL); the host does not wait. On the CPU
 * backend the word is written at once. FAILED_PRECONDITION when the session
 * has no fast channel (the word lives in it) or CUDA cannot write host
 * memory from a stream here. The word orders frees after one stream: frees
 * fenced on several streams need those streams to wait for each other
 * first. */
int32_t pagealloc_queue_release(pagealloc_client* client, void* cuda_stream,
                                uint64_t* release_value,
                                pagealloc_error* error);
/* Frees slots' pages / pages (as pagealloc_free_*_in_order) once the work
 * queued on `cuda_stream` before the call is done: pagealloc_queue_release,
 * then a free carrying its value. The daemon checks the free at once; the
 * pages stay the session's until the stream passes the write. */
int32_t pagealloc_free_slots_on_stream(pagealloc_client* client,
                                       const int64_t* slots, size_t num_slots,
                                       int32_t order, void* cuda_stream,
                                       int64_t* pages_freed,
                                       pagealloc_error* error);
int32_t pagealloc_free_pages_on_stream(pagealloc_client* client,
                                       const int64_t* pages, size_t num_pages,
                                       int32_t order, void* cuda_stream,
                                       int64_t* pages_freed,
                                       pagealloc_error* error);
/* A free of pages that stay the session's until its release word reaches
 * `release_value` (a value pagealloc_queue_release gave, or the largest of
 * several); 0 is an ordinary free. */
int32_t pagealloc_free_pages_after(pagealloc_client* client,
                                   const int64_t* pages, size_t num_pages,
                                   int32_t order, uint64_t release_value,
                                   int64_t* pages_freed,
                                   pagealloc_error* error);

/* Pushes a checkpoint on the session's stack (docs/design.md sections 3
 * and 10: at most 64; a 65th ends the oldest): the pages the session is
 * given from now on are recorded. */
int32_t pagealloc_checkpoint(pagealloc_client* client, pagealloc_error* error);
/* ABI 1.1. The same, with the new checkpoint's id (never 0) in
 * `*checkpoint_id` (may be NULL), for pagealloc_rollback_to. */
int32_t pagealloc_checkpoint_id(pagealloc_client* client,
                                uint64_t* checkpoint_id,
                                pagealloc_error* error);
/* Rolls back to the latest checkpoint, which ends: returns the pages given
 * since it that the session still owns to the front of the free list;
 * `*pages_returned` (may be NULL) receives how many. FAILED_PRECONDITION
 * without a checkpoint. */
int32_t pagealloc_rollback(pagealloc_client* client, int64_t* pages_returned,
                           pagealloc_error* error);
/* ABI 1.1. Rolls back to checkpoint `checkpoint_id` (0: the latest, as
 * pagealloc_rollback): the checkpoints after it end, it stays active and
 * may be rolled back to again (SGLang's restore_state of one saved state).
 * FAILED_PRECONDITION when it is not active (ended by a rollback to an
 * earlier one, a clear, or pushed out of the stack). */
int32_t pagealloc_rollback_to(pagealloc_client* client, uint64_t checkpoint_id,
                              int64_t* pages_returned, pagealloc_error* error);

/* ABI 1.1. Frees every page of the session and ends its checkpoints; the
 * session stays. When no page of the pool is owned afterwards the free list
 * is reset to 1..num_pages and nothing stays parked (SGLang's clear).
 * `*pages_freed` (may be NULL) receives the pages freed. */
int32_t pagealloc_clear_session(pagealloc_client* client, int64_t* pages_freed,
                                pagealloc_error* error);

/* ABI 1.9. The pages the session owns as the daemon has them, ascending,
 * in order with its earlier calls (pagealloc::Client::ListPages; shared
 * prefix pages it holds references on are not listed): up to `capacity`
 * into `pages` (may be NULL when capacity is 0), and their count into
 * `*count`. OUT_OF_RANGE, with `*count` set to the pages owned and nothing
 * written, when they do not fit. After a call that failed because the
 * daemon could not tell whether it took effect, the caller reconciles
 * with this. */
int32_t pagealloc_list_pages(pagealloc_client* client, int64_t* pages,
                             size_t capacity, size_t* count,
                             pagealloc_error* error);

/* ------------------------------------------------------------------------
 * Stats
 * ------------------------------------------------------------------------ */

/* The daemon's pool figures (v1::GetStatsResponse without sessions). */
typedef struct pagealloc_stats {
  size_t struct_size; /* sizeof(pagealloc_stats), set by the caller */
  pagealloc_pool_info pool;
  int64_t free_pages;   /* in the free list */
  int64_t parked_pages; /* freed under the sorted policy, not yet merged */
  int64_t used_pages;   /* owned by sessions */
  int64_t slots_allocated_total;
  int64_t pages_allocated_total;
  int64_t pages_freed_total;
  int64_t out_of_pages_total; /* requests refused for want of pages */
  int64_t free_list_sorts_total;
  int64_t launches_total;
  int64_t sessions_active;
  /* ABI 1.1. The pool's semantics profile, as pagealloc_pool_semantics. */
  char semantics[16];
  /* ABI 1.5. Shared prefix pages (section 13 of docs/design.md): now held
   * by a session, held by none with their KV still valid, pinned, and
   * cached without a pin (what an allocation may evict); keys looked up
   * by matches and found, since start. */
  int64_t prefix_published_pages;
  int64_t prefix_cached_pages;
  int64_t prefix_pinned_pages;
  int64_t prefix_evictable_pages;
  int64_t prefix_lookup_pages_total;
  int64_t prefix_hit_pages_total;
} pagealloc_stats;

/* Asks the daemon for its pool figures; stats->struct_size must be set. */
int32_t pagealloc_get_stats(pagealloc_client* client, pagealloc_stats* stats,
                            pagealloc_error* error);

/* ------------------------------------------------------------------------
 * Free lists and the pool (ABI 1.1)
 * ------------------------------------------------------------------------ */

/* A debug read of the daemon's free list and parked pages (GetFreeLists).
 * The caller fills the buffers and capacities (pagealloc_free_lists_init
 * first); the library writes the rest. */
typedef struct pagealloc_free_lists {
  size_t struct_size; /* sizeof(pagealloc_free_lists) */
  /* In: where to write the front of the free list, in the order it hands
   * pages out, and how many entries fit there (0: none wanted). */
  int64_t* free_pages;
  int64_t free_capacity;
  /* In: where to write the parked pages (freed under the sorted policy,
   * not yet merged), in the order they were freed. */
  int64_t* parked_pages;
  int64_t parked_capacity;
  /* Out: the entries written to each buffer. */
  int64_t num_free;
  int64_t num_parked;
  /* Out: each list's whole length (more than written when cut). */
  int64_t free_count;
  int64_t parked_count;
} pagealloc_free_lists;

/* As pagealloc_client_options_init: pass sizeof(*lists). */
void pagealloc_free_lists_init(pagealloc_free_lists* lists, size_t struct_size);

/* Reads the free lists of the session's pool (a call of its own to the
 * daemon at the session's target; it needs no session, so it works after
 * close too). At most 1048576 entries of each list are read. */
int32_t pagealloc_get_free_lists(const pagealloc_client* client,
                                 pagealloc_free_lists* lists,
                                 pagealloc_error* error);

/* Calls that need no session (client/admin.h): what operators, tools and
 * tests ask a daemon directly. */
typedef struct pagealloc_admin_options {
  size_t struct_size; /* sizeof(pagealloc_admin_options) */
  /* gRPC target: "unix:///run/pagealloc/gpu0.sock" or "host:port". NULL or
   * "": GPU 0's daemon where pagealloc-server listens by default
   * (/run/pagealloc, then $XDG_RUNTIME_DIR/pagealloc); UNAVAILABLE, naming
   * the paths looked at, when no socket is there. */
  const char* target;
  /* Deadline of the call, in ms (default 5000). */
  int64_t timeout_ms;
} pagealloc_admin_options;

/* As pagealloc_client_options_init: pass sizeof(*options). */
void pagealloc_admin_options_init(pagealloc_admin_options* options,
                                  size_t struct_size);

/* pagealloc_get_free_lists of the daemon at options->target. */
int32_t pagealloc_admin_get_free_lists(const pagealloc_admin_options* options,
                                       pagealloc_free_lists* lists,
                                       pagealloc_error* error);

/* Resets the daemon's whole pool to its first state (ClearPool);
 * `*pages_freed` (may be NULL) receives the pages freed. Refused with
 * FAILED_PRECONDITION, naming the sessions' pages, while any session holds
 * pages, unless `force` is nonzero, which the daemon refuses
 * (PERMISSION_DENIED) unless it runs with --allow_forced_clear; a forced
 * clear voids every session's slots without telling them. */
int32_t pagealloc_admin_clear_pool(const pagealloc_admin_options* options,
                                   int32_t force, int64_t* pages_freed,
                                   pagealloc_error* error);

/* ------------------------------------------------------------------------
 * KV buffers (ABI 1.1)
 *
 * When the daemon owns the KV memory (--kv_layout, docs/design.md section
 * 11) every session maps the pool's one KV slab at connect: the same bytes
 * in every process. Each buffer is a [num_slots, element_shape...] array of
 * one dtype, slot-major: slot s's element starts at data + s *
 * stride_bytes. Attention kernels read and write it in place at the slots
 * the session was given. The mapping lives as long as the client handle
 * (destroying it unmaps the slab here; the memory lives on in the daemon
 * and the other sessions).
 * ------------------------------------------------------------------------ */

/* One buffer, filled by pagealloc_kv_buffer_get. */
typedef struct pagealloc_kv_buffer {
  size_t struct_size; /* sizeof(pagealloc_kv_buffer), set by the caller */
  /* "k.0", "v.0", "kv.3", or a custom layout's name. NUL-terminated, valid
   * while the client handle lives. */
  const char* name;
  /* "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "int8", "uint8",
   * "int32": a static string. */
  const char* dtype;
  int64_t dtype_bytes;  /* bytes of one value */
  int64_t num_slots;    /* (num_pages + 1) * page_size, page 0 included */
  int64_t stride_bytes; /* bytes from one slot's element to the next */
  void* data;           /* slot 0: a device pointer when on_device */
  int32_t on_device;    /* nonzero: GPU memory (CUDA backend) */
  int32_t device;       /* CUDA ordinal in this process; -1 on the CPU */
  /* One slot's element: `rank` dimensions at element_shape, valid while
   * the client handle lives. */
  const int64_t* element_shape;
  int64_t rank;
} pagealloc_kv_buffer;

/* The pool's KV buffers mapped by this session (0 when the daemon hands
 * out slot indices only, or map_kv_slab was off). */
int64_t pagealloc_kv_buffer_count(const pagealloc_client* client);

/* Fills `*buffer` (buffer->struct_size set by the caller; the library
 * writes at most that many bytes) with buffer `index`. OUT_OF_RANGE for an
 * index outside 0 .. pagealloc_kv_buffer_count() - 1. */
int32_t pagealloc_kv_buffer_get(const pagealloc_client* client, int64_t index,
                                pagealloc_kv_buffer* buffer,
                                pagealloc_error* error);

/* The index of the buffer named `name`, or -1. */
int64_t pagealloc_kv_buffer_find(const pagealloc_client* client,
                                 const char* name);

/* The mapped slab (every buffer lies inside): its first byte, `*bytes`
 * long, a device pointer when `*on_device` is nonzero. NULL (and 0) without
 * a slab. Any out-pointer may be NULL. */
void* pagealloc_kv_slab(const pagealloc_client* client, int64_t* bytes,
                        int32_t* on_device);

/* Copies `bytes` from host memory `src` into the slab at `dst` (inside it,
 * e.g. a buffer's data + s * stride_bytes), or out of the slab at `src`
 * into host memory `dst`: memcpy on the CPU backend, a synchronous
 * cudaMemcpy on the CUDA backend. For tests, examples and tools; kernels
 * use the buffers in place. INVALID_ARGUMENT for a range outside the slab,
 * FAILED_PRECONDITION without one. */
int32_t pagealloc_kv_copy_to_slab(const pagealloc_client* client, void* dst,
                                  const void* src, int64_t bytes,
                                  pagealloc_error* error);
int32_t pagealloc_kv_copy_from_slab(const pagealloc_client* client, void* dst,
                                    const void* src, int64_t bytes,
                                    pagealloc_error* error);

/* ------------------------------------------------------------------------
 * Page reserves (ABI 1.2; client/page_reserve.h, docs/design.md section
 * 12): whole pages the daemon records as the session's, held in this
 * process, so that a step takes its pages without a round trip. The
 * reserve's own thread refills it below its low mark and returns pages
 * above its high mark; the daemon asks for its unused pages when another
 * session finds the pool short. A reserve handle may be used from several
 * threads at once; destroy it before its client.
 * ------------------------------------------------------------------------ */

typedef struct pagealloc_reserve pagealloc_reserve;

typedef struct pagealloc_reserve_options {
  size_t struct_size;      /* sizeof(pagealloc_reserve_options), by _init */
  int64_t initial_batch;   /* the first low mark, >= 1 (8) */
  int64_t max_pages;       /* the most it holds (0: a quarter of the quota,
                              or of the pool) */
  int64_t tick_us;         /* the thread's longest sleep (1000) */
  int64_t idle_ticks;      /* ticks without a take that halve the batch
                              (100) */
  int64_t starved_wait_us; /* how long a take the pool cannot serve retries
                              while other sessions return pages (20000) */
} pagealloc_reserve_options;

/* Fills `*options` with the defaults. */
void pagealloc_reserve_options_init(pagealloc_reserve_options* options,
                                    size_t struct_size);

/* Starts a reserve for `client`'s session (`options` may be NULL: the
 * defaults). INVALID_ARGUMENT for options out of range. */
int32_t pagealloc_reserve_create(pagealloc_client* client,
                                 const pagealloc_reserve_options* options,
                                 pagealloc_reserve** reserve,
                                 pagealloc_error* error);

/* Stops the reserve's thread and returns its pages to the daemon; pages
 * taken and not put back stay the session's. NULL is a no-op. */
void pagealloc_reserve_destroy(pagealloc_reserve* reserve);

/* Writes `n` page ids of the session to `pages[0..n)`: from the reserve,
 * without a round trip when it holds them (else one refill on this
 * thread). Token slot t of page p is p * page_size + t. RESOURCE_EXHAUSTED,
 * nothing taken, when the pool or the session's quota cannot supply them. */
int32_t pagealloc_reserve_take(pagealloc_reserve* reserve, int64_t n,
                               int64_t* pages, pagealloc_error* error);

/* ABI 1.6. Writes to `pages[0..*count)` the ids the next takes would hand
 * out, in the order consecutive pagealloc_reserve_take calls write them
 * (pages[0] first), *count = min(max_pages, the pages in the reserve);
 * `pages` may be NULL when max_pages is 0. Takes nothing and changes
 * nothing, the reserve's stats included. A guess, not a hold: refills go
 * under them, but before the next take the reserve's thread may return
 * some of them, a put pushes its pages on top, and another thread may
 * take them; a caller that keeps them (to prepare their slots ahead
 * of a step) checks each take's pages against them. INVALID_ARGUMENT for
 * a NULL reserve or count, or NULL pages with max_pages > 0. */
int32_t pagealloc_reserve_peek(pagealloc_reserve* reserve, int64_t* pages,
                               size_t max_pages, int64_t* count,
                               pagealloc_error* error);

/* ABI 1.10. Takes k = min(max_pages, the pages in the reserve now) pages,
 * as pagealloc_reserve_take hands them out, into `pages[0..k)`; *count =
 * k. Never a round trip to the daemon, so an empty reserve gives none.
 * For a caller that wants what the reserve can spare, or all it holds: a
 * count read from pagealloc_reserve_get_stats and then taken races the
 * reserve's thread, whose return of pages past the high mark can leave
 * the take short, and a short take refills on the caller's thread.
 * `pages` may be NULL when max_pages is 0. INVALID_ARGUMENT for a NULL
 * reserve or count, or NULL pages with max_pages > 0. */
int32_t pagealloc_reserve_take_held(pagealloc_reserve* reserve, int64_t* pages,
                                    size_t max_pages, int64_t* count,
                                    pagealloc_error* error);

/* Puts `n` pages taken from this reserve back into it (they stay the
 * session's). INVALID_ARGUMENT naming the page, and nothing changes, when
 * one was not taken from it or is named twice. */
int32_t pagealloc_reserve_put(pagealloc_reserve* reserve, const int64_t* pages,
                              size_t n, pagealloc_error* error);

/* ABI 1.3. pagealloc_reserve_put for pages the caller's work on
 * `cuda_stream` (NULL: the legacy default stream) may still read: the
 * session's next release value is queued on the stream and the pages are
 * tagged with it, so a return of them to the daemon waits for that work
 * (the release fence). pagealloc_queue_release's errors, nothing put back
 * then. */
int32_t pagealloc_reserve_put_on_stream(pagealloc_reserve* reserve,
                                        const int64_t* pages, size_t n,
                                        void* cuda_stream,
                                        pagealloc_error* error);

/* ABI 1.10. pagealloc_reserve_put (`fence` 0) or
 * pagealloc_reserve_put_on_stream (`fence` nonzero, on `cuda_stream`) with
 * the pages going under those the reserve holds, as a refill's do: they leave
 * after every page it holds now, pages[0] first (the back of a free list,
 * where SGLang's token allocator queues its frees), and a return to the daemon
 * takes them first. The errors are those of the put it stands for. */
int32_t pagealloc_reserve_put_under(pagealloc_reserve* reserve,
                                    const int64_t* pages, size_t n,
                                    void* cuda_stream, int32_t fence,
                                    pagealloc_error* error);

/* A reserve's counts, filled by pagealloc_reserve_get_stats. */
typedef struct pagealloc_reserve_stats {
  size_t struct_size; /* set by the caller */
  int64_t pages;      /* in the reserve now */
  int64_t handed_out; /* taken and not put back */
  int64_t batch;      /* the low mark now */
  int64_t refills;    /* refill calls */
  int64_t pages_refilled;
  int64_t returns; /* return calls (high mark and the daemon's asks) */
  int64_t pages_returned;
  int64_t reclaims;     /* the daemon's asks answered */
  int64_t sync_refills; /* refills on a taker's thread: its round trips */
  int64_t takes;        /* takes answered */
  /* ABI 1.5. The reserve thread's refills the pool refused, each starting
   * or lengthening its backoff, and the refills it skipped while backed off
   * (client/page_reserve.h, "A full pool"). */
  int64_t refills_refused;
  int64_t refills_backed_off;
} pagealloc_reserve_stats;

int32_t pagealloc_reserve_get_stats(const pagealloc_reserve* reserve,
                                    pagealloc_reserve_stats* stats,
                                    pagealloc_error* error);

/* ------------------------------------------------------------------------
 * Slots expanded in this process (ABI 1.3; client/local_expansion.h,
 * docs/design.md, "Slots expanded on the caller's stream"): SGLang's
 * alloc_extend and alloc_decode planned here from host lengths, over new
 * pages taken from the reserve (no round trip while it holds them), and
 * written on the caller's CUDA stream from a device last_loc
 * (PAGEALLOC_MEMORY_DEVICE) or on this thread from a host one
 * (PAGEALLOC_MEMORY_HOST). A call refused takes nothing from the reserve.
 * The calls of one reserve are serialized.
 * ------------------------------------------------------------------------ */

typedef enum pagealloc_memory {
  PAGEALLOC_MEMORY_HOST = 0,  /* last_loc and out are host arrays */
  PAGEALLOC_MEMORY_DEVICE = 1 /* CUDA device memory; stream is used */
} pagealloc_memory;

/* Extends request i from prefix_lens[i] to seq_lens[i] tokens (host
 * arrays of n), last_loc[i] the slot of its last prefix token (-1 for an
 * empty prefix): writes sum(seq_lens[i] - prefix_lens[i]) slots to `out`,
 * request after request, and their number to `*num_slots` (may be NULL).
 * `last_loc` and `out` are in `memory`; `stream` is a cudaStream_t for
 * PAGEALLOC_MEMORY_DEVICE (NULL: the legacy default stream): the slots are
 * written when the stream gets there, and the call returns without waiting
 * for it. INVALID_ARGUMENT naming the request and its values,
 * RESOURCE_EXHAUSTED (nothing taken) when the reserve cannot supply the
 * pages, FAILED_PRECONDITION for device memory in a library built without
 * CUDA. */
int32_t pagealloc_reserve_alloc_extend(pagealloc_reserve* reserve,
                                       int32_t memory, size_t n,
                                       const int64_t* prefix_lens,
                                       const int64_t* seq_lens,
                                       const int64_t* last_loc, int64_t* out,
                                       void* stream, int64_t* num_slots,
                                       pagealloc_error* error);

/* One new token for each of n requests whose sequences reach seq_lens[i]
 * tokens with it: writes n slots to `out`. As
 * pagealloc_reserve_alloc_extend with prefix_lens[i] = seq_lens[i] - 1. */
int32_t pagealloc_reserve_alloc_decode(pagealloc_reserve* reserve,
                                       int32_t memory, size_t n,
                                       const int64_t* seq_lens,
                                       const int64_t* last_loc, int64_t* out,
                                       void* stream, int64_t* num_slots,
                                       pagealloc_error* error);

/* The first device last_loc the kernel refused since the last call of
 * this (one outside the slab, in page 0, or without room in its page for
 * the request's slots; those slots went to page 0, the padding page):
 * INVALID_ARGUMENT naming the request's index in its batch and the value,
 * else OK. Covers the calls whose streams the caller has synchronized. */
int32_t pagealloc_reserve_take_device_error(pagealloc_reserve* reserve,
                                            pagealloc_error* error);

/* ABI 1.5. The page ids the last pagealloc_reserve_alloc_extend or _decode
 * in `memory` took from the reserve, if it wrote its slots: `*count` of
 * them (0 after a refused call, or before any), of which the first
 * min(*count, capacity) are written to `pages` (may be NULL when capacity
 * is 0), request after request. A caller whose slots went to the device
 * keeps its host record of the session's pages (what it may free or put
 * back) from these without reading the slots back. */
int32_t pagealloc_reserve_last_expansion_pages(pagealloc_reserve* reserve,
                                               int32_t memory, int64_t* pages,
                                               size_t capacity, int64_t* count,
                                               pagealloc_error* error);

/* ABI 1.8. The caller keeps `pages[0..n)`, handed out by this reserve,
 * out of its books for good (pages published to the prefix index): they
 * stay the session's, freed through the daemon, and a put or
 * pagealloc_reserve_free_slots refuses them from now on. Pages the reserve
 * has not handed out are skipped; `*disowned` (may be NULL) receives how
 * many it let go of. */
int32_t pagealloc_reserve_disown(pagealloc_reserve* reserve,
                                 const int64_t* pages, size_t n,
                                 int64_t* disowned, pagealloc_error* error);

/* ABI 1.8. SGLang's free of whole pages in this process (client/
 * page_free.h): `slots[0..n)` in `memory`, page_size slots a page with
 * each page's in order from its first slot, go back into the reserve, the
 * first page named the next one a take hands out. Writes the pages' ids in
 * the order named to `pages` (room for n / page_size) and their number to
 * `*num_pages` (may be NULL). PAGEALLOC_MEMORY_DEVICE: the slots are CUDA
 * memory, copied on `stream` (NULL: the legacy default stream) into
 * `host_copy[0..n)` (pinned memory for an asynchronous copy) before
 * anything is checked, where they stay, and the call waits for the stream; the
 * pages are put untagged, the stream's work before the free being done.
 * PAGEALLOC_MEMORY_HOST: `host_copy` is unused; with `fence` nonzero the pages
 * are tagged with a release value queued on `stream`, as
 * pagealloc_reserve_put_on_stream. INVALID_ARGUMENT, and nothing is put, when
 * the slots are not whole pages or the reserve did not hand out a page or it is
 * named twice; FAILED_PRECONDITION for device memory in a library built without
 * CUDA. */
int32_t pagealloc_reserve_free_slots(pagealloc_reserve* reserve, int32_t memory,
                                     const int64_t* slots, size_t n,
                                     void* stream, int32_t fence,
                                     int64_t* host_copy, int64_t* pages,
                                     int64_t* num_pages,
                                     pagealloc_error* error);

/* ABI 1.11. The first half of a free that does not wait for the GPU
 * (client/page_free.h): queues on `cuda_stream` (a cudaStream_t; NULL: the
 * legacy default stream) the copy of `bytes` bytes of CUDA memory at
 * `device` to `host` (pinned host memory) and returns without waiting.
 * `host` holds them once the stream has run the copy: the caller records
 * an event on the stream after this call and reads `host` once it has
 * passed, then frees the slots with pagealloc_reserve_free_slots
 * (PAGEALLOC_MEMORY_HOST, no fence: the work queued before the copy is
 * done). INVALID_ARGUMENT for a NULL buffer with bytes > 0;
 * FAILED_PRECONDITION in a library built without CUDA. */
int32_t pagealloc_copy_to_host_async(const void* device, size_t bytes,
                                     void* host, void* cuda_stream,
                                     pagealloc_error* error);

/* ------------------------------------------------------------------------
 * Shared prefix pages (ABI 1.4; docs/design.md section 13,
 * docs/integration.md "Shared prefix pages"). Keys are
 * PAGEALLOC_PREFIX_KEY_BYTES opaque bytes per page, computed by the caller
 * (a chained block hash), passed as one array of count * 32 bytes. Shared
 * pages are read-only for every session.
 * ------------------------------------------------------------------------ */

#define PAGEALLOC_PREFIX_KEY_BYTES 32

/* Publishes the session's `pages[0..n)` under `keys` (n * 32 bytes, in
 * chain order; keys[0]'s parent is `parent_key`, 32 bytes, or NULL at a
 * chain's start). Only after the GPU work that writes the pages' KV is
 * complete, only whole pages. The session keeps one reference on each
 * (pagealloc_free_pages drops it). `pin` nonzero pins them (a per-session
 * bound). Out, each may be NULL: `published_pages[0..n)` the page each key
 * is published under now (the existing page when `existing[i]` is 1: the
 * caller's page stays its own, to free), `*newly_published`. All or
 * nothing; INVALID_ARGUMENT naming keys[i] or pages[i]. */
int32_t pagealloc_publish(pagealloc_client* client, const int64_t* pages,
                          const uint8_t* keys, size_t n,
                          const uint8_t* parent_key, int32_t pin,
                          int64_t* published_pages, uint8_t* existing,
                          int64_t* newly_published, pagealloc_error* error);

/* Writes to `pages[0..*num_matched)` the pages of the longest prefix of the
 * chain `keys` (num_keys * 32 bytes) that is published or cached; with
 * `adopt` nonzero the session takes a reference on each in the same step.
 * `pages` has room for num_keys entries. */
int32_t pagealloc_match_prefix(pagealloc_client* client, const uint8_t* keys,
                               size_t num_keys, int32_t adopt, int64_t* pages,
                               int64_t* num_matched, pagealloc_error* error);

/* Removes the session's pins from `pages[0..n)`; `*unpinned` (may be NULL)
 * receives how many. */
int32_t pagealloc_unpin_prefix(pagealloc_client* client, const int64_t* pages,
                               size_t n, int64_t* unpinned,
                               pagealloc_error* error);

/* The daemon's ResetPrefixCache (no session): evicts every cached,
 * unpinned page; `*pages_evicted` (may be NULL) receives how many. */
int32_t pagealloc_admin_reset_prefix_cache(
    const pagealloc_admin_options* options, int64_t* pages_evicted,
    pagealloc_error* error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PAGEALLOC_CLIENT_PAGEALLOC_H_ */

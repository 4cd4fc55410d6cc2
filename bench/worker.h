// A worker: one scheduler-like client process of a phase (pagealloc-bench
// --worker). It keeps Workload::batch live sequences and, between the
// coordinator's go and stop, runs scheduler steps: admit into empty places
// (AllocExtend), then decode every sequence (AllocDecode), extend a few by a
// prefill chunk (AllocExtend) or speculate (checkpoint, draft AllocExtend,
// Rollback), by the weights. Every answer is checked against the
// allocation semantics as it is recorded; finished sequences' pages are
// freed with the next allocation call (piggyback_ops) or in one Free. Only
// the RPCs are timed.

#ifndef PAGEALLOC_BENCH_WORKER_H_
#define PAGEALLOC_BENCH_WORKER_H_

#include <cstdint>
#include <string>

#include "bench/workload.h"

namespace pagealloc::bench {

struct WorkerOptions {
  std::string target;        // the daemon
  int index = 0;             // this worker's slot in the control block
  std::string control_file;  // the coordinator's control block
  std::string out_path;      // where the WorkerReport goes
  uint64_t seed = 1;         // the phase's; the worker adds its index
  bool fast_channel = true;  // ClientOptions.fast_channel
  int client_spin_us = 500;  // ClientOptions.fast_channel_spin
  Workload workload;
};

// Runs one worker: connects, admits its first sequences, reports ready,
// steps from go until stop, writes its WorkerReport (bench/rpc_stats.h) to
// out_path and reports done. Returns the process exit status: 0, or 1 after
// printing why on stderr and marking itself failed.
int RunWorker(const WorkerOptions& options);

}  // namespace pagealloc::bench

#endif  // PAGEALLOC_BENCH_WORKER_H_

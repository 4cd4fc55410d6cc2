// MetricsHttpServer: the daemon's HTTP port for GET /metrics and GET
// /healthz, built to keep answering /healthz while anyone who can reach the
// port misbehaves.
//
// Why not cpp-httplib's server. Debian 12's cpp-httplib (0.11.4) gives each
// connection a worker of a fixed pool for as long as it is open, bounds
// only each single read (a client dripping one byte a second never trips
// it), queues new connections behind busy workers without bound, and has no
// cap per client: 64 dripping connections held every worker, and the
// liveness probe timed out. So we serve the port ourselves, in one event
// thread over non-blocking sockets:
//
// - A request's head must arrive whole within Options::header_timeout of
//   the accept, and its body (if any, at most max_body_bytes, discarded)
//   within body_timeout after the head; an answer must be taken within
//   write_timeout. A connection past its deadline is closed.
// - At most max_connections_per_address connections per client address and
//   max_connections in all are read from; a new connection over either
//   bound closes the oldest one still sending its request in that scope
//   (a probe's fresh connection always gets in; a flood costs the
//   flooder). Connections whose answer is being made or sent are never
//   closed for a newcomer.
// - /healthz is answered on the event thread as soon as its request is in;
//   /metrics is rendered on a thread of its own (scrapes that queue up
//   while one renders share the next rendering), so a slow scrape never
//   delays health.
// - One request per connection (the answer says `Connection: close`).
//
// This class is thread-safe.

#ifndef PAGEALLOC_SERVER_METRICS_HTTP_SERVER_H_
#define PAGEALLOC_SERVER_METRICS_HTTP_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pagealloc {

// MetricsHttpServer's bounds (outside the class, so that its defaults can
// serve as a default argument).
struct MetricsHttpOptions {
  absl::Duration header_timeout = absl::Seconds(2);
  absl::Duration body_timeout = absl::Seconds(2);
  absl::Duration write_timeout = absl::Seconds(5);
  int max_connections = 256;
  int max_connections_per_address = 32;
  size_t max_header_bytes = 8192;
  size_t max_body_bytes = 65536;
};

class MetricsHttpServer {
 public:
  using Options = MetricsHttpOptions;

  // Binds `host`:`port` (a numeric IPv4 or IPv6 address or a host name;
  // port 0 picks a free one) with SO_REUSEADDR but not SO_REUSEPORT (a
  // second daemon on the port fails here rather than sharing it), and
  // serves from threads of its own. `render` produces /metrics; /healthz
  // answers 200 "serving" while `health()` is OK and 503 with its message
  // otherwise ("draining", or why the daemon cannot accept connections).
  // Both are called from the server's threads and must be thread-safe.
  // UNAVAILABLE naming host and port when it cannot bind or listen.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, std::function<std::string()> render,
      std::function<absl::Status()> health, Options options = Options());
  // Stops (Stop).
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  // Closes the port and every connection, and joins the threads; after it
  // neither callback runs. Idempotent.
  void Stop();

  // Connections closed before their request was answered since start:
  // past a deadline, or for a newcomer over a bound.
  int64_t timed_out() const;
  int64_t shed() const;

 private:
  class Impl;
  MetricsHttpServer(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  const int port_;
};

}  // namespace pagealloc

#endif  // PAGEALLOC_SERVER_METRICS_HTTP_SERVER_H_

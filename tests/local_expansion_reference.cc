#include "tests/local_expansion_reference.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "allocator/requests.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace pagealloc::testing {

std::unique_ptr<InProcessServer> StartExpansionDaemon(int64_t num_pages,
                                                      int64_t page_size) {
  absl::StatusOr<std::unique_ptr<InProcessServer>> server =
      InProcessServer::Start(
          CpuTestOptions(num_pages, page_size, int64_t{1} << 16));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<Client> ConnectSession(InProcessServer& daemon,
                                       int64_t quota_pages) {
  ClientOptions options;
  options.client_name = "local";
  options.quota_pages = quota_pages;
  absl::StatusOr<std::unique_ptr<Client>> client = daemon.Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

PageReserveOptions ManualReserve(int64_t batch, int64_t max_pages) {
  PageReserveOptions options;
  options.initial_batch = batch;
  options.max_pages = max_pages;
  options.background = false;
  options.starved_wait = absl::ZeroDuration();
  return options;
}

absl::Status StartExpansionPair(int64_t num_pages, int64_t page_size,
                                ExpansionPair* pair) {
  pair->local_daemon = StartExpansionDaemon(num_pages, page_size);
  pair->thin_daemon = StartExpansionDaemon(num_pages, page_size);
  if (pair->local_daemon == nullptr || pair->thin_daemon == nullptr) {
    return absl::InternalError("a daemon did not start");
  }
  pair->local = ConnectSession(*pair->local_daemon);
  pair->thin = ConnectSession(*pair->thin_daemon);
  if (pair->local == nullptr || pair->thin == nullptr) {
    return absl::InternalError("a session did not connect");
  }
  ASSIGN_OR_RETURN(pair->reserve, PageReserve::Create(
                                      pair->local.get(),
                                      ManualReserve(num_pages / 2, num_pages)));
  return pair->reserve->Maintain();  // the whole pool, in the daemon's order
}

absl::Status PutBackBatch(PageReserve& reserve, absl::Span<const int64_t> order,
                          absl::Span<const int64_t> prefix_pages) {
  const size_t used = order.size() - reserve.pages().size();
  RETURN_IF_ERROR(reserve.Put(order.subspan(0, used)));
  return reserve.Put(prefix_pages);
}

ExpansionBatch MakeExpansionBatch(bool decode, int64_t page_size,
                                  int64_t usable_slots,
                                  const std::vector<int64_t>& prefix_pages,
                                  int64_t max_new_pages, std::mt19937_64& rng) {
  ExpansionBatch batch;
  batch.decode = decode;
  int64_t pages = 0;
  for (int64_t prefix_page : prefix_pages) {
    const bool empty = rng() % 8 == 0;
    // Within half the pool, so that no request is longer than the pool.
    const int64_t prefix =
        empty ? 0
              : 1 + static_cast<int64_t>(
                        rng() % std::min<int64_t>(500, usable_slots / 2));
    int64_t extend = decode ? 1 : static_cast<int64_t>(rng() % 100);
    if (!decode && rng() % 10 == 0) extend = 0;  // no new slots
    const ExtendShape shape{prefix, prefix + extend, -1};
    const int64_t need = NewPagesNeeded(shape, page_size);
    if (pages + need > max_new_pages) break;
    pages += need;
    batch.prefix_lens.push_back(prefix);
    batch.seq_lens.push_back(prefix + extend);
    batch.last_locs.push_back(
        prefix == 0 ? -1 : prefix_page * page_size + (prefix - 1) % page_size);
    batch.slots += extend;
  }
  return batch;
}

absl::StatusOr<std::vector<int64_t>> ThinSlotsOnFreeList(
    Client& thin, int64_t num_pages, absl::Span<const int64_t> prefix_pages,
    absl::Span<const int64_t> order, const ExpansionBatch& batch) {
  const int64_t page_size = thin.pool().page_size();
  ASSIGN_OR_RETURN(Allocation everything, thin.Alloc({num_pages * page_size}));
  RETURN_IF_ERROR(everything.status());
  thin.Release(everything);
  absl::flat_hash_set<int64_t> keep(prefix_pages.begin(), prefix_pages.end());
  keep.insert(order.begin(), order.end());
  std::vector<int64_t> rest;
  for (int64_t page = 1; page <= num_pages; ++page) {
    if (!keep.contains(page)) rest.push_back(page);
  }
  if (!rest.empty()) RETURN_IF_ERROR(thin.FreePages(rest).status());
  RETURN_IF_ERROR(thin.FreePages(order).status());
  std::vector<int64_t> slots;
  {
    ASSIGN_OR_RETURN(Allocation a,
                     batch.decode
                         ? thin.AllocDecode(batch.seq_lens, batch.last_locs)
                         : thin.AllocExtend(batch.prefix_lens, batch.seq_lens,
                                            batch.last_locs));
    RETURN_IF_ERROR(a.status());
    std::vector<int64_t> host;
    for (size_t i = 0; i < a.size(); ++i) {
      const RequestSlots& r = a[i];
      host.resize(r.count);
      RETURN_IF_ERROR(thin.CopyToHost(r.slots, r.count, host.data()));
      slots.insert(slots.end(), host.begin(), host.end());
    }
    thin.Release(a);
  }
  RETURN_IF_ERROR(thin.ClearSession().status());
  return slots;
}

}  // namespace pagealloc::testing

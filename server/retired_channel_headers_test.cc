// RetiredChannelHeaders: an ended session's channel is freed but for its
// header page, which a client still mapping the channel reads until the
// bounds free it too; then the client's mapping reads zeros.

#include "server/retired_channel_headers.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memory/unique_fd.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// A channel's memory as the daemon holds it, and the client's mapping of
// it (which the daemon cannot take away).
struct Channel {
  std::unique_ptr<SharedRegion> daemon;
  std::unique_ptr<SharedRegion> client;
};

Channel NewChannel(char fill) {
  Channel channel;
  auto daemon = SharedRegion::Create("retired-test", 3 * kPage);
  EXPECT_OK(daemon);
  channel.daemon = *std::move(daemon);
  std::memset(channel.daemon->base(), fill, 3 * kPage);
  auto client = SharedRegion::FromFd(
      UniqueFd(fcntl(channel.daemon->fd(), F_DUPFD_CLOEXEC, 0)), 3 * kPage,
      SharedRegion::Access::kReadOnly);
  EXPECT_OK(client);
  channel.client = *std::move(client);
  return channel;
}

// Whether the client reads `fill` at byte `at` (else zero, freed).
char ClientByte(const Channel& channel, size_t at) {
  return static_cast<const char*>(channel.client->base())[at];
}

TEST(RetiredChannelHeadersTest, KeepsTheHeaderAndFreesTheRestAtOnce) {
  RetiredChannelHeaders retired({});
  Channel channel = NewChannel('a');
  retired.Retire(std::move(channel.daemon), 64, absl::Now());
  EXPECT_EQ(ClientByte(channel, 0), 'a');
  EXPECT_EQ(ClientByte(channel, kPage - 1), 'a');
  EXPECT_EQ(ClientByte(channel, kPage), 0);
  EXPECT_EQ(ClientByte(channel, 3 * kPage - 1), 0);
  EXPECT_EQ(retired.size(), 1);
}

TEST(RetiredChannelHeadersTest, FreesTheOldestPastTheCountEvenWhileMapped) {
  MemoryBudget budget("host", "--session_memory", 1 << 20);
  RetiredChannelHeaders::Options options;
  options.max_headers = 2;
  options.budget = &budget;
  RetiredChannelHeaders retired(options);
  Channel channels[4] = {NewChannel('a'), NewChannel('b'), NewChannel('c'),
                         NewChannel('d')};
  const absl::Time now = absl::Now();
  for (Channel& channel : channels) {
    retired.Retire(std::move(channel.daemon), 64, now);
  }
  EXPECT_EQ(retired.size(), 2);
  EXPECT_EQ(retired.freed_total(), 2);
  EXPECT_EQ(ClientByte(channels[0], 0), 0);
  EXPECT_EQ(ClientByte(channels[1], 0), 0);
  EXPECT_EQ(ClientByte(channels[2], 0), 'c');
  EXPECT_EQ(ClientByte(channels[3], 0), 'd');
  // A page of the budget per header kept, no more.
  EXPECT_EQ(budget.used(), static_cast<int64_t>(2 * kPage));
}

TEST(RetiredChannelHeadersTest, FreesAHeaderOnceItsTimeIsUp) {
  RetiredChannelHeaders::Options options;
  options.keep_for = absl::Seconds(10);
  RetiredChannelHeaders retired(options);
  Channel first = NewChannel('a');
  Channel second = NewChannel('b');
  const absl::Time now = absl::Now();
  retired.Retire(std::move(first.daemon), 64, now);
  retired.Retire(std::move(second.daemon), 64, now + absl::Seconds(10));
  EXPECT_EQ(ClientByte(first, 0), 0);
  EXPECT_EQ(ClientByte(second, 0), 'b');
  EXPECT_EQ(retired.size(), 1);
}

TEST(RetiredChannelHeadersTest, FreesExpiredHeadersWhenAsked) {
  RetiredChannelHeaders::Options options;
  options.keep_for = absl::Seconds(10);
  RetiredChannelHeaders retired(options);
  EXPECT_EQ(retired.next_expiry(), absl::InfiniteFuture());
  Channel channel = NewChannel('a');
  const absl::Time now = absl::Now();
  retired.Retire(std::move(channel.daemon), 64, now);
  EXPECT_EQ(retired.next_expiry(), now + absl::Seconds(10));
  retired.FreeExpired(now + absl::Seconds(9));
  EXPECT_EQ(ClientByte(channel, 0), 'a');
  retired.FreeExpired(now + absl::Seconds(10));
  EXPECT_EQ(ClientByte(channel, 0), 0);
  EXPECT_EQ(retired.next_expiry(), absl::InfiniteFuture());
}

TEST(RetiredChannelHeadersTest, FreesTheHeaderAtOnceWhenTheBudgetHasNoPage) {
  MemoryBudget budget("host", "--session_memory", 0);
  RetiredChannelHeaders::Options options;
  options.budget = &budget;
  RetiredChannelHeaders retired(options);
  Channel channel = NewChannel('a');
  retired.Retire(std::move(channel.daemon), 64, absl::Now());
  EXPECT_EQ(ClientByte(channel, 0), 0);
  EXPECT_EQ(retired.size(), 0);
  EXPECT_EQ(retired.freed_total(), 1);
  EXPECT_EQ(budget.used(), 0);
}

TEST(RetiredChannelHeadersTest, FreesWhatItKeepsWhenDestroyed) {
  Channel channel = NewChannel('a');
  {
    RetiredChannelHeaders retired({});
    retired.Retire(std::move(channel.daemon), 64, absl::Now());
    EXPECT_EQ(ClientByte(channel, 0), 'a');
  }
  EXPECT_EQ(ClientByte(channel, 0), 0);
}

// Once the daemon goes with every session, no header is freed: neither
// those kept, nor one retired later (past the bounds), nor at destruction;
// the rest of each channel still is.
TEST(RetiredChannelHeadersTest, LeavesItsHeadersToTheClientsOnceTheDaemonGoes) {
  Channel kept = NewChannel('a');
  Channel later = NewChannel('b');
  {
    RetiredChannelHeaders::Options options;
    options.max_headers = 1;
    options.keep_for = absl::ZeroDuration();
    RetiredChannelHeaders retired(options);
    retired.LeaveToClients();
    retired.Retire(std::move(kept.daemon), 64, absl::Now());
    retired.Retire(std::move(later.daemon), 64, absl::Now());
    retired.FreeExpired(absl::Now() + absl::Hours(1));
    EXPECT_EQ(retired.size(), 2);
    EXPECT_EQ(retired.freed_total(), 0);
  }
  EXPECT_EQ(ClientByte(kept, 0), 'a');
  EXPECT_EQ(ClientByte(later, kPage - 1), 'b');
  EXPECT_EQ(ClientByte(later, kPage), 0);
}

}  // namespace
}  // namespace pagealloc

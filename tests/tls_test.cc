// TCP with TLS: certificates made by openssl at test time; a client that
// trusts the CA is served, a plaintext client is not, and with client
// verification on, a client without a certificate is refused.

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/in_process_server.h"
#include "tests/status_matchers.h"

namespace pagealloc {
namespace {

using ::pagealloc::testing::InProcessServer;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/tls");
    const std::string d = *dir_;
    const std::string script = absl::StrFormat(
        R"(set -e; mkdir -p %1$s; cd %1$s
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=pagealloc-test-ca \
  -keyout ca.key -out ca.pem 2>/dev/null
for who in server client; do
  openssl req -newkey rsa:2048 -nodes -subj /CN=$who -keyout $who.key \
    -out $who.csr 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > $who.ext
  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
    -days 2 -extfile $who.ext -out $who.pem 2>/dev/null
done)",
        d);
    ASSERT_EQ(std::system(script.c_str()), 0) << "openssl failed";
  }

  absl::StatusOr<std::unique_ptr<InProcessServer>> StartServer(
      bool verify_clients) {
    ServerOptions options;
    options.backend = "cpu";
    options.pool = {64, 16, FreePolicy::kLifo};
    options.listen = {"127.0.0.1:0"};
    options.tls.cert_file = *dir_ + "/server.pem";
    options.tls.key_file = *dir_ + "/server.key";
    if (verify_clients) options.tls.client_ca_file = *dir_ + "/ca.pem";
    return InProcessServer::Start(options);
  }

  // Connects over TCP: the first listen address (the fixture's Unix socket
  // comes after it).
  absl::StatusOr<std::unique_ptr<Client>> Connect(
      InProcessServer& server,
      std::shared_ptr<grpc::ChannelCredentials> creds) {
    ClientOptions options;
    options.target = server.server().bound_addresses()[0];
    options.client_name = "tls";
    options.credentials = std::move(creds);
    options.call_timeout = absl::Seconds(5);
    return Client::Connect(options);
  }

  static std::shared_ptr<grpc::ChannelCredentials> Tls(bool with_cert) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Read(*dir_ + "/ca.pem");
    if (with_cert) {
      ssl.pem_cert_chain = Read(*dir_ + "/client.pem");
      ssl.pem_private_key = Read(*dir_ + "/client.key");
    }
    return grpc::SslCredentials(ssl);
  }

  static std::string* dir_;
};
std::string* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, ServesClientsThatTrustTheCa) {
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(/*verify_clients=*/false));
  ASSERT_OK_AND_ASSIGN(auto client, Connect(*server, Tls(false)));
  CallOptions inline_results;
  inline_results.return_inline = true;
  // Over TCP a client cannot map the CPU backend's ring unless it shares
  // the host; inline results work anywhere.
  ASSERT_OK_AND_ASSIGN(Allocation a, client->Alloc({32}, inline_results));
  EXPECT_OK(a.status());
  EXPECT_EQ(a[0].count, 32);
}

TEST_F(TlsTest, RefusesPlaintextClients) {
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(/*verify_clients=*/false));
  EXPECT_THAT(Connect(*server, grpc::InsecureChannelCredentials()).status(),
              pagealloc::testing::StatusIs(absl::StatusCode::kUnavailable,
                                           ::testing::_));
}

TEST_F(TlsTest, WithClientVerificationACertificateIsRequired) {
  ASSERT_OK_AND_ASSIGN(auto server, StartServer(/*verify_clients=*/true));
  EXPECT_THAT(Connect(*server, Tls(/*with_cert=*/false)).status(),
              pagealloc::testing::StatusIs(absl::StatusCode::kUnavailable,
                                           ::testing::_));
  ASSERT_OK_AND_ASSIGN(auto client, Connect(*server, Tls(/*with_cert=*/true)));
  EXPECT_OK(client->session_status());
}

TEST_F(TlsTest, HalfConfiguredTlsIsAnError) {
  ServerOptions options;
  options.backend = "cpu";
  options.pool = {8, 16, FreePolicy::kLifo};
  options.listen = {"127.0.0.1:0"};
  options.tls.cert_file = *dir_ + "/server.pem";
  EXPECT_THAT(InProcessServer::Start(options).status(),
              pagealloc::testing::StatusIs(
                  absl::StatusCode::kInvalidArgument,
                  ::testing::HasSubstr("needs both --tls_cert_file and "
                                       "--tls_key_file")));
}

}  // namespace
}  // namespace pagealloc

/* The C ABI from C99: the header compiles as C (also as C89, see
 * c89_header.c), the shared library links into a C program, and the calls
 * that need no daemon behave as pagealloc.h says. The calls against a live
 * daemon are tests/pagealloc_c_api_test.cc's. */
#define _POSIX_C_SOURCE 200809L /* access() */

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client/pagealloc.h"

size_t pagealloc_c89_header_sizes(void);

static int failures = 0;

#define EXPECT(condition)                                                      \
  do {                                                                         \
    if (!(condition)) {                                                        \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

static void TestVersions(void) {
  EXPECT(pagealloc_abi_version() == PAGEALLOC_ABI_VERSION);
  EXPECT((pagealloc_abi_version() >> 16) == PAGEALLOC_ABI_VERSION_MAJOR);
  EXPECT(strcmp(pagealloc_version(), "") != 0);
  EXPECT(pagealloc_c89_header_sizes() > 0);
}

static void TestCodeNames(void) {
  EXPECT(strcmp(pagealloc_status_code_name(PAGEALLOC_OK), "OK") == 0);
  EXPECT(strcmp(pagealloc_status_code_name(PAGEALLOC_RESOURCE_EXHAUSTED),
                "RESOURCE_EXHAUSTED") == 0);
  EXPECT(strcmp(pagealloc_status_code_name(PAGEALLOC_UNAUTHENTICATED),
                "UNAUTHENTICATED") == 0);
  EXPECT(strcmp(pagealloc_status_code_name(17), "UNKNOWN_CODE") == 0);
  EXPECT(strcmp(pagealloc_status_code_name(-1), "UNKNOWN_CODE") == 0);
}

static void TestOptionDefaults(void) {
  pagealloc_client_options options;
  pagealloc_call_options call;
  memset(&options, 0xff, sizeof(options));
  pagealloc_client_options_init(&options, sizeof(options));
  EXPECT(options.struct_size == sizeof(options));
  EXPECT(options.target == NULL);
  EXPECT(options.call_timeout_ms == 30000);
  EXPECT(options.fast_channel == 1);
  EXPECT(options.fast_channel_spin_us == 500);
  EXPECT(options.ring_capacity_slots == 0);
  memset(&call, 0xff, sizeof(call));
  pagealloc_call_options_init(&call, sizeof(call));
  EXPECT(call.struct_size == sizeof(call));
  EXPECT(call.return_inline == 0 && call.async_completion == 0);
  EXPECT(call.free_pages_first == NULL && call.num_free_pages_first == 0);
  EXPECT(call.all_or_nothing == 0);
  EXPECT(options.map_kv_slab == 1 && options.register_secret == NULL);
}

/* ABI 1.1's structures and the calls that need no daemon. */
static void TestAbiOneOne(void) {
  pagealloc_admin_options admin;
  pagealloc_free_lists lists;
  pagealloc_kv_buffer buffer;
  pagealloc_error error;
  int64_t freed = -1;
  EXPECT((pagealloc_abi_version() & 0xFFFF) >= 1);
  memset(&admin, 0xff, sizeof(admin));
  pagealloc_admin_options_init(&admin, sizeof(admin));
  EXPECT(admin.struct_size == sizeof(admin));
  EXPECT(admin.target == NULL && admin.timeout_ms == 5000);
  memset(&lists, 0xff, sizeof(lists));
  pagealloc_free_lists_init(&lists, sizeof(lists));
  EXPECT(lists.struct_size == sizeof(lists));
  EXPECT(lists.free_pages == NULL && lists.free_capacity == 0);
  EXPECT(lists.num_free == 0 && lists.free_count == 0);
  /* No target: where the daemon listens by default, and nothing there
   * (unless a real daemon listens on this host, which we leave alone). */
  if (access("/run/pagealloc/gpu0.sock", F_OK) != 0) {
    EXPECT(pagealloc_admin_get_free_lists(&admin, &lists, &error) ==
           PAGEALLOC_UNAVAILABLE);
    EXPECT(strstr(error.message, "looked at /run/pagealloc/gpu0.sock") != NULL);
  }
  admin.target = "unix:///nonexistent/pagealloc-c-test.sock";
  EXPECT(pagealloc_admin_get_free_lists(&admin, &lists, &error) ==
         PAGEALLOC_UNAVAILABLE);
  EXPECT(freed == -1);
  /* NULL clients. */
  EXPECT(pagealloc_kv_buffer_count(NULL) == 0);
  EXPECT(pagealloc_kv_buffer_find(NULL, "k.0") == -1);
  EXPECT(pagealloc_kv_slab(NULL, NULL, NULL) == NULL);
  buffer.struct_size = sizeof(buffer);
  EXPECT(pagealloc_kv_buffer_get(NULL, 0, &buffer, &error) ==
         PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(strcmp(pagealloc_pool_semantics(NULL), "") == 0);
  EXPECT(pagealloc_clear_session(NULL, &freed, &error) ==
         PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(pagealloc_free_slots_in_order(NULL, NULL, 0,
                                       PAGEALLOC_FREE_ORDER_ASCENDING, &freed,
                                       &error) == PAGEALLOC_INVALID_ARGUMENT);
}

/* ABI 1.3's local expansion: the calls refuse a NULL reserve. */
static void TestAbiOneThree(void) {
  pagealloc_error error;
  const int64_t seq[] = {3};
  const int64_t last[] = {-1};
  int64_t out[1] = {0};
  int64_t slots = -1;
  EXPECT((pagealloc_abi_version() & 0xFFFF) >= 3);
  EXPECT(PAGEALLOC_MEMORY_HOST == 0 && PAGEALLOC_MEMORY_DEVICE == 1);
  EXPECT(pagealloc_reserve_alloc_decode(NULL, PAGEALLOC_MEMORY_HOST, 1, seq,
                                        last, out, NULL, &slots,
                                        &error) == PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(strstr(error.message, "reserve is NULL") != NULL);
  EXPECT(pagealloc_reserve_alloc_extend(NULL, PAGEALLOC_MEMORY_DEVICE, 1, seq,
                                        seq, last, out, NULL, &slots,
                                        &error) == PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(pagealloc_reserve_take_device_error(NULL, &error) ==
         PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(slots == -1 && out[0] == 0);
}

static void TestConnectRefusals(void) {
  pagealloc_client_options options;
  pagealloc_client* client = (pagealloc_client*)&options; /* overwritten */
  pagealloc_error error;
  int32_t code;

  pagealloc_client_options_init(&options, sizeof(options));
  /* No target: where the daemon listens by default (checked only where no
   * real daemon listens there). */
  if (access("/run/pagealloc/gpu0.sock", F_OK) != 0) {
    code = pagealloc_connect(&options, &client, &error);
    EXPECT(code == PAGEALLOC_UNAVAILABLE);
    EXPECT(error.code == PAGEALLOC_UNAVAILABLE);
    EXPECT(strstr(error.message, "looked at /run/pagealloc/gpu0.sock") != NULL);
    EXPECT(client == NULL);
  }

  /* Nothing listens there: the daemon's absence, as gRPC reports it. */
  options.target = "unix:///nonexistent/pagealloc-c-test.sock";
  options.call_timeout_ms = 5000;
  code = pagealloc_connect(&options, &client, &error);
  EXPECT(code == PAGEALLOC_UNAVAILABLE);
  EXPECT(error.code == PAGEALLOC_UNAVAILABLE);
  EXPECT(strlen(error.message) > 0);
  EXPECT(client == NULL);

  options.call_timeout_ms = 0;
  code = pagealloc_connect(&options, &client, &error);
  EXPECT(code == PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(strstr(error.message, "call_timeout_ms (0)") != NULL);

  /* A structure not filled by its _init function. */
  memset(&options, 0, sizeof(options));
  code = pagealloc_connect(&options, &client, &error);
  EXPECT(code == PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(strstr(error.message, "struct_size") != NULL);

  /* NULL error pointers are allowed: the code still says what happened. */
  EXPECT(pagealloc_connect(NULL, &client, NULL) == PAGEALLOC_INVALID_ARGUMENT);
}

static void TestNullHandles(void) {
  pagealloc_error error;
  pagealloc_allocation* allocation;
  int64_t slot = 1;
  EXPECT(pagealloc_close(NULL, &error) == PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(pagealloc_session_status(NULL, &error) == PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(pagealloc_alloc(NULL, &slot, 1, NULL, &allocation, &error) ==
         PAGEALLOC_INVALID_ARGUMENT);
  EXPECT(allocation == NULL);
  EXPECT(pagealloc_allocation_get_view(NULL) == NULL);
  pagealloc_client_destroy(NULL);
  pagealloc_allocation_destroy(NULL);
}

int main(void) {
  TestVersions();
  TestCodeNames();
  TestOptionDefaults();
  TestConnectRefusals();
  TestNullHandles();
  TestAbiOneOne();
  TestAbiOneThree();
  if (failures != 0) {
    fprintf(stderr, "%d expectation(s) failed\n", failures);
    return 1;
  }
  printf("pagealloc C ABI (C99): all checks passed\n");
  return 0;
}

/* Compiled with -std=c89 -pedantic-errors: pagealloc.h must stay C89. */
#include "client/pagealloc.h"

/* Uses every type of the header so that a C89 compiler sees them all. */
size_t pagealloc_c89_header_sizes(void) {
  pagealloc_client_options client_options;
  pagealloc_call_options call_options;
  pagealloc_allocation_view view;
  pagealloc_pool_info pool;
  pagealloc_stats stats;
  pagealloc_error error;
  pagealloc_status_code code = PAGEALLOC_OK;
  pagealloc_backend backend = PAGEALLOC_BACKEND_CPU;
  pagealloc_free_order order = PAGEALLOC_FREE_ORDER_ASCENDING;
  pagealloc_free_lists lists;
  pagealloc_admin_options admin_options;
  pagealloc_kv_buffer kv_buffer;
  return sizeof(client_options) + sizeof(call_options) + sizeof(view) +
         sizeof(pool) + sizeof(stats) + sizeof(error) + (size_t)code +
         (size_t)backend + (size_t)order + sizeof(lists) +
         sizeof(admin_options) + sizeof(kv_buffer);
}

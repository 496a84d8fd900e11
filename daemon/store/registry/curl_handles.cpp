#include "daemon/store/registry/curl_handles.hpp"

#include <mutex>
#include <stdexcept>

namespace thaw::store {

void ensure_curl_initialised() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Failing here means libcurl cannot allocate its globals: nothing network-related
    // can work, and there is no caller able to recover.
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      throw std::runtime_error("curl_global_init failed");
    }
  });
}

CurlSlist make_header_list(const std::vector<std::string>& headers) {
  CurlSlist list;
  for (const auto& header : headers) {
    curl_slist* grown = curl_slist_append(list.get(), header.c_str());
    if (grown == nullptr) throw std::bad_alloc();
    (void)list.release();
    list.reset(grown);
  }
  return list;
}

}  // namespace thaw::store

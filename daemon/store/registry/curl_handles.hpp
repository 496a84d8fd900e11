// RAII owners for libcurl handles, and libcurl's one-time global initialisation.
#pragma once

#include <curl/curl.h>

#include <memory>
#include <string>
#include <vector>

namespace thaw::store {

struct CurlEasyDeleter {
  void operator()(CURL* easy) const { curl_easy_cleanup(easy); }
};
struct CurlMultiDeleter {
  void operator()(CURLM* multi) const { curl_multi_cleanup(multi); }
};
struct CurlSlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

using CurlEasy = std::unique_ptr<CURL, CurlEasyDeleter>;
using CurlMulti = std::unique_ptr<CURLM, CurlMultiDeleter>;
using CurlSlist = std::unique_ptr<curl_slist, CurlSlistDeleter>;

// curl_global_init must run once before any handle exists and is not safe to race with
// handle creation on every libcurl build; every constructor of a handle here calls this
// first. It never calls curl_global_cleanup: other parts of the process may use libcurl.
void ensure_curl_initialised();

// A header list for CURLOPT_HTTPHEADER ("Name: value" lines); null when `headers` is empty.
CurlSlist make_header_list(const std::vector<std::string>& headers);

}  // namespace thaw::store

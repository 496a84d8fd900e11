#include "daemon/store/registry/http_get.hpp"

#include <fmt/format.h>

#include "daemon/store/registry/curl_handles.hpp"

namespace thaw::store {

namespace {

struct BodyCollector {
  std::string* body;
  std::uint64_t max;
  bool overflow = false;
};

size_t collect(char* data, size_t size, size_t nmemb, void* user) {
  auto& sink = *static_cast<BodyCollector*>(user);
  size_t n = size * nmemb;
  if (sink.body->size() + n > sink.max) {
    sink.overflow = true;
    return 0;
  }
  sink.body->append(data, n);
  return n;
}

}  // namespace

std::expected<HttpResponse, RegistryError> http_request(std::string_view url,
                                                        const RegistryOptions& options,
                                                        bool head_only, std::uint64_t max_body) {
  ensure_curl_initialised();
  CurlEasy easy(curl_easy_init());
  if (!easy) throw std::bad_alloc();
  std::string url_copy(url);
  HttpResponse response;
  BodyCollector collector{&response.body, max_body};
  char error_buffer[CURL_ERROR_SIZE] = {};
  CurlSlist headers = make_header_list(options.headers);
  CURL* h = easy.get();
  curl_easy_setopt(h, CURLOPT_URL, url_copy.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options.connect_timeout.count()));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(options.request_timeout.count()));
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "thaw-store/0.1");
  if (headers) curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
  if (head_only) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else {
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &collector);
  }
  CURLcode rc = curl_easy_perform(h);
  if (collector.overflow) {
    return std::unexpected(RegistryError{
        RegistryErrc::bad_listing,
        fmt::format("GET {}: answer larger than {} bytes (not a listing?)", url, max_body)});
  }
  if (rc != CURLE_OK) {
    return std::unexpected(RegistryError{
        RegistryErrc::transport,
        fmt::format("{} {}: {}", head_only ? "HEAD" : "GET", url,
                    error_buffer[0] != '\0' ? error_buffer : curl_easy_strerror(rc))});
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.status);
  curl_off_t length = -1;
  if (curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK &&
      length >= 0) {
    response.content_length = static_cast<std::uint64_t>(length);
  }
  char* effective = nullptr;
  if (curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK && effective) {
    response.effective_url = effective;
  }
  return response;
}

}  // namespace thaw::store

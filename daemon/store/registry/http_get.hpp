// Small blocking HTTP requests for registry metadata (listings, manifests, HEAD sizes).
// Bulk bytes never go through here: they go through RangeFetcher.
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/store/registry/registry.hpp"
#include "daemon/store/registry/registry_error.hpp"

namespace thaw::store {

struct HttpResponse {
  long status = 0;
  std::string body;
  std::optional<std::uint64_t> content_length;  // from the final response's headers
  std::string effective_url;                    // after redirects
};

// GET (or HEAD when `head_only`) following redirects. Any status is a value; only a
// failure to get an answer at all (connect, TLS, timeout, body over `max_body`) is an
// error. `max_body` guards against a listing URL that turns out to be a model file.
std::expected<HttpResponse, RegistryError> http_request(std::string_view url,
                                                        const RegistryOptions& options,
                                                        bool head_only,
                                                        std::uint64_t max_body = 64u << 20);

}  // namespace thaw::store

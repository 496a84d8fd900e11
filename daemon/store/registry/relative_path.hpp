// Model and file names coming from registries are untrusted: a listing or manifest that
// names "../../etc/passwd" must not make the cache write outside its directory. Every
// name is checked here before it is used to build a URL or a path.
#pragma once

#include <expected>
#include <string>
#include <string_view>

#include "daemon/store/registry/registry_error.hpp"

namespace thaw::store {

// Accepts "a/b/c.safetensors": non-empty '/'-separated segments, none of them "." or
// "..", no leading '/', no backslash, no NUL or other control characters. `what` names
// the thing checked in the error ("file name from http://.../listing").
std::expected<void, RegistryError> check_relative_path(std::string_view path,
                                                       std::string_view what);

// Percent-encodes every segment of a checked relative path, keeping the '/' separators,
// so names with spaces or '#' survive as URLs.
std::string url_escape_path(std::string_view relative_path);

// Joins a base URL and a relative part with exactly one '/'.
std::string join_url(std::string_view base, std::string_view relative);

}  // namespace thaw::store

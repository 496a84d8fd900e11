// A model registry: where a model's files are listed and fetched from.
//
// One narrow interface for the three kinds thaw reads from — a plain HTTP(S) directory
// (nginx), the Hugging Face hub API shape (so a hub mirror can serve), and a local
// directory — so the store's logic never knows which one it talks to.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/store/registry/manifest.hpp"
#include "daemon/store/registry/registry_error.hpp"

namespace thaw::store {

struct RemoteFile {
  std::string path;  // relative to the model, checked (no "..")
  std::uint64_t size = 0;
  std::optional<std::string> sha256;  // whole-file digest when the registry knows it
};

struct ModelListing {
  std::string model;
  std::vector<RemoteFile> files;     // sorted by path
  std::optional<Manifest> manifest;  // thaw-manifest.json when the model has one

  const RemoteFile* find(std::string_view path) const;
};

// Where one file's bytes come from: an http(s) URL for the RangeFetcher, or an absolute
// local path it copies from.
struct FileSource {
  enum class Kind { http, local };
  Kind kind = Kind::http;
  std::string location;  // URL or absolute path
};

struct RegistryOptions {
  std::string revision = "main";     // Hugging Face revision (branch, tag or commit)
  std::vector<std::string> headers;  // extra request headers, e.g. "Authorization: Bearer …"
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds request_timeout{60'000};  // one listing/HEAD request
};

class Registry {
 public:
  virtual ~Registry() = default;

  // Every file of `model` with its size. A thaw-manifest.json, when present, is the
  // authority (and is returned in the listing); otherwise the registry's own listing.
  virtual std::expected<ModelListing, RegistryError> list(std::string_view model) = 0;

  // Where to read `file` of `model` from. Does no I/O.
  virtual std::expected<FileSource, RegistryError> source(std::string_view model,
                                                          std::string_view file) const = 0;

  // "http directory http://host/models", for logs and errors.
  virtual std::string describe() const = 0;
};

// Opens a registry from an address:
//   http://host/base, https://…      plain directory, <base>/<model>/<file>
//   hf+http://host, hf+https://…     Hugging Face hub API at that base
//   file:///abs/dir, /abs/dir, rel   local directory, <dir>/<model>/<file>
std::expected<std::unique_ptr<Registry>, RegistryError> open_registry(std::string_view address,
                                                                      RegistryOptions options = {});

}  // namespace thaw::store

// Why fetching a model (or a stage of it) into the host cache failed.
//
// One code per kind of cause a caller branches on (cache_full: evict or grow the cache;
// integrity: the registry's bytes are not the published ones; fetch: the registry could
// not deliver), and a one-line message naming the model, the file and what to do.
#pragma once

#include <string>
#include <string_view>

namespace thaw::store {

enum class ModelFetchErrc {
  invalid_argument,  // bad options: stage, chunk size, cache key
  registry,          // the registry could not list the model, or lacks a file it needs
  model,             // the model's config, index or safetensors headers are malformed
  cache,             // the host cache refused (I/O, conflict with a cached copy, locked)
  cache_full,        // the cache's filesystem or budget cannot hold the files
  fetch,             // a byte range could not be fetched (after the fetcher's retries)
  integrity,         // a chunk or a whole file failed its sha256
  unverified,        // nothing to check the files against (no thaw-manifest.json) and
                     // options.allow_unverified is false
  cancelled,         // ModelFetch::cancel()
};

std::string_view to_string(ModelFetchErrc code);

struct ModelFetchError {
  ModelFetchErrc code = ModelFetchErrc::fetch;
  std::string message;
};

}  // namespace thaw::store

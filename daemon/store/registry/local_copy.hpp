// One step of copying a part from a local source file into the sink: pread into a buffer
// and sink.write(), or copy_file_range() straight into the sink's descriptor when it
// offers one (falling back to pread where the kernel refuses, e.g. across filesystems).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "daemon/store/registry/fetch_engine.hpp"

namespace thaw::store {

struct LocalSliceResult {
  std::uint64_t copied = 0;
  std::optional<Fault> fault;  // always permanent: a local file does not heal by retrying
};

// Copies up to `max_bytes` from part.next, advancing part.next. Opens the source on first
// use (part.local_fd).
LocalSliceResult copy_local_slice(FetchPart& part, FetchSink& sink, std::span<std::byte> buffer,
                                  std::uint64_t max_bytes);

}  // namespace thaw::store

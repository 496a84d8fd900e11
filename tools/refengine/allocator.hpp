// The reference engine's device memory allocator, modelled on PyTorch's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp), so the driver sees the same calls a PyTorch program makes.
//
// Default mode: segments from cuMemAlloc_v2, sub-allocated in blocks.
//  - Sizes round up to 512 bytes.
//  - Requests of at most 1 MiB come from the small pool, whose segments are 2 MiB.
//  - Larger requests come from the large pool: a request under 10 MiB gets a 20 MiB segment;
//    a larger one a segment rounded up to a multiple of 2 MiB (PyTorch's get_allocation_size).
//  - Best fit among the free blocks of the same pool and stream; a block is split when the
//    remainder is at least 512 bytes (small pool) or more than 1 MiB (large pool).
//  - Freed blocks are cached (merged with free neighbours) and reused; empty_cache() returns
//    segments with no allocated block to the driver with cuMemFree.
//  - On CUDA_ERROR_OUT_OF_MEMORY the cache is emptied and the allocation retried once; if that
//    fails too, OutOfMemory is thrown.
// Expandable segments mode (PyTorch's expandable_segments:True): per stream one
// cuMemAddressReserve of 1.125x the device's total memory (rounded to 20 MiB pages), grown
// at its end by 20 MiB pages: cuMemCreate (requested handle type POSIX file descriptor, so
// pages can be exported), cuMemMap, cuMemSetAccess. empty_cache() synchronizes the segment's
// stream, then unmaps and releases the free pages at the segment's end. (PyTorch also uses
// 2 MiB-page segments for the small pool and unmaps free pages in the middle of a segment;
// here small requests share the 20 MiB-page segment and only the free tail is unmapped.) When a
// page cannot be created for lack of memory, the pages mapped for that request are returned,
// the cache is emptied, and the growth retried once before OutOfMemory is thrown.
// All public members may be called from several threads (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "driver.hpp"

namespace refengine {

class OutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct AllocatorStats {
  std::uint64_t reserved_bytes = 0;   // bytes of segments held (mapped pages in expandable mode)
  std::uint64_t allocated_bytes = 0;  // bytes of blocks handed out (rounded sizes)
  std::uint64_t segments = 0;         // cuMemAlloc segments / expandable segments
  std::uint64_t mapped_pages = 0;     // expandable mode: 20 MiB pages mapped
  std::uint64_t address_reserved_bytes = 0;  // expandable mode: VA reserved
};

class CachingAllocator {
 public:
  enum class Mode { kDefault, kExpandableSegments };

  static constexpr std::size_t kMinBlockSize = 512;
  static constexpr std::size_t kSmallSize = 1 << 20;       // largest small-pool request
  static constexpr std::size_t kSmallBuffer = 2 << 20;     // small-pool segment size
  static constexpr std::size_t kLargeBuffer = 20 << 20;    // large segment / expandable page
  static constexpr std::size_t kMinLargeAlloc = 10 << 20;  // below: a whole kLargeBuffer
  static constexpr std::size_t kRoundLarge = 2 << 20;      // large segment rounding

  // The device's context must be current on the calling thread for every call.
  CachingAllocator(Driver& driver, CUdevice device, Mode mode);
  ~CachingAllocator();  // releases everything (allocated blocks included)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A device pointer to at least `size` bytes, usable on `stream`; size 0 gives 0.
  CUdeviceptr allocate(std::size_t size, CUstream stream = nullptr);
  // Returns a pointer from allocate() to the cache. Unknown pointers: std::invalid_argument.
  void free(CUdeviceptr ptr);
  // Returns unused cached memory to the driver.
  void empty_cache();

  AllocatorStats stats() const;
  Mode mode() const { return mode_; }
  // Expandable mode: the physical allocation handles of the mapped pages, in address order
  // (the allocator keeps ownership), e.g. for cuMemExportToShareableHandle.
  std::vector<CUmemGenericAllocationHandle> page_handles() const;

  static std::size_t round_size(std::size_t size);
  static std::size_t allocation_size(std::size_t rounded);

 private:
  struct Segment;
  struct Block {
    CUdeviceptr ptr = 0;
    std::size_t size = 0;
    bool allocated = false;
    Segment* segment = nullptr;
  };
  struct Segment {
    CUdeviceptr base = 0;
    std::size_t size = 0;  // bytes usable (mapped, in expandable mode)
    CUstream stream = nullptr;
    bool small = false;
    bool expandable = false;
    std::size_t reserved = 0;                         // expandable: VA reserved
    std::vector<CUmemGenericAllocationHandle> pages;  // expandable: mapped pages in order
  };

  Block* find_free(std::size_t size, CUstream stream, bool small);
  Block* split(Block* b, std::size_t size);
  Block* new_segment(std::size_t size, CUstream stream, bool small);
  Block* grow_expandable(std::size_t size, CUstream stream, bool retried = false);
  Segment* expandable_for(CUstream stream);
  bool map_page(Segment& s);
  void unmap_last_page(Segment& s);
  void release_free_segments();
  AllocatorStats stats_locked() const;
  [[noreturn]] void throw_oom(std::size_t size, CUresult r);

  Driver& d_;
  CUdevice device_;
  Mode mode_;
  std::size_t total_memory_ = 0;
  std::map<CUdeviceptr, Block> blocks_;  // every block, by address
  std::vector<std::unique_ptr<Segment>> segments_;
  mutable std::mutex mu_;
};

}  // namespace refengine

// The on-disk (in-memory, on tmpfs) layout of a readiness map, version 1.
//
// One map per cached file, shared by the daemon (the only writer) and any number of
// consumer processes (readers, mapping it PROT_READ):
//
//   [0, 512)        ReadinessHeader
//   [512, 512+8W)   chunk bitmap, W = ceil(chunk_count / 64) 64-bit words; bit c of word
//                   c/64 is set once chunk c has been written and verified
//   ... zero padding up to region_bytes (page-rounded; huge-page-rounded on hugetlbfs)
//
// Fields in native byte order: a map is shared by processes of one machine only (a
// foreign byte order fails the magic check). Fields marked (atomic) change while
// others read them and are only ever accessed with __atomic builtins; the rest are
// written once, before the map becomes visible to anyone.
#pragma once

#include <cstddef>
#include <cstdint>

namespace thaw::store::readiness_layout {

// "THAWRDY1" read as a little-endian u64.
inline constexpr uint64_t kMagic = 0x3159445257414854ull;
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kHeaderBytes = 512;
inline constexpr size_t kReasonBytes = 256;
// Bounds the bitmap to 8 MiB: 64 Mi chunks (at 4 MiB chunks that is 256 TiB), so a
// foreign file cannot make a reader map something absurd.
inline constexpr uint64_t kMaxChunkCount = uint64_t{1} << 26;

enum : uint32_t { kStateFilling = 1, kStateComplete = 2, kStateFailed = 3 };

struct Header {
  uint64_t magic;             // kMagic, written last at creation
  uint32_t version;           // kVersion
  uint32_t header_bytes;      // offset of the bitmap: kHeaderBytes
  uint64_t region_bytes;      // size of the whole map == the readiness file's size
  uint64_t file_size;         // bytes of the cached file
  uint64_t chunk_size;        // bytes per chunk (the last chunk may be shorter)
  uint64_t chunk_count;       // ceil(file_size / chunk_size)
  uint64_t generation;        // (atomic) 1 at creation, +1 at every resume after failure
  uint32_t state;             // (atomic) kState*
  uint32_t epoch;             // (atomic) futex word: +1 after every change readers wait for
  uint64_t contiguous_bytes;  // (atomic) bytes [0, P) are all verified
  uint64_t verified_chunks;   // (atomic) number of set bits
  uint8_t reserved0[48];
  char failure_reason[kReasonBytes];  // NUL-terminated; meaningful while state == failed
  uint8_t reserved1[128];
};

static_assert(sizeof(Header) == kHeaderBytes);
static_assert(offsetof(Header, state) == 56);
static_assert(offsetof(Header, epoch) % 4 == 0, "futex words must be 4-byte aligned");
static_assert(offsetof(Header, contiguous_bytes) % 8 == 0);
static_assert(offsetof(Header, failure_reason) == 128);

inline constexpr uint64_t bitmap_words(uint64_t chunk_count) {
  return (chunk_count + 63) / 64;
}

}  // namespace thaw::store::readiness_layout

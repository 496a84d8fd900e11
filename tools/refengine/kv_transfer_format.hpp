// The KV-transfer body (docs/KV-TRANSFER.md): the KV-cache blocks of one request for a range of
// layers, as a pipeline stage exports them and a consolidating full worker imports them
// (HydraServe §6.2). A 64-byte little-endian header, then for each layer of the range the K of
// every block, then the V of every block; a block is [n_head, block_size, head_dim] fp32, the
// engine's cache layout (kernels.h), so export and import are plain copies.
//
// No CUDA, no engine: the migration library and the fuzz test use it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

namespace refengine {

inline constexpr std::uint32_t kKvMagic = 0x564B4854;  // "THKV" read little-endian
inline constexpr std::uint16_t kKvVersion = 1;
inline constexpr std::uint16_t kKvHeaderBytes = 64;
inline constexpr std::uint32_t kKvDtypeF32 = 1;
// Bounds on what a header may claim, checked before anything is sized from it.
inline constexpr std::uint32_t kKvMaxTokens = 1u << 20;
inline constexpr std::uint32_t kKvMaxLayers = 4096;
inline constexpr std::uint32_t kKvMaxHeads = 4096;
inline constexpr std::uint32_t kKvMaxHeadDim = 4096;
inline constexpr std::uint32_t kKvMaxBlockSize = 1024;

struct KvBlobHeader {
  std::uint64_t request_id = 0;
  std::uint32_t layer_begin = 0, layer_end = 0;  // [begin, end) of the model's layers
  std::uint32_t n_layer = 0;                     // the model's layer count
  std::uint32_t n_head = 0, head_dim = 0, block_size = 0;
  std::uint32_t dtype = kKvDtypeF32;
  std::uint32_t token_count = 0;  // positions whose K and V the blocks hold
  std::uint32_t num_blocks = 0;   // ceil(token_count / block_size)
  std::uint64_t payload_bytes = 0;

  // Bytes of one block of one layer's K (or V).
  std::uint64_t block_bytes() const {
    return std::uint64_t(n_head) * block_size * head_dim * sizeof(float);
  }
  // Offset in the payload of block `i` of layer `layer` (absolute layer index), K or V.
  std::uint64_t offset(std::uint32_t layer, bool v, std::uint32_t i) const {
    return ((std::uint64_t(layer - layer_begin) * 2 + (v ? 1 : 0)) * num_blocks + i) *
           block_bytes();
  }
};

// Fills payload_bytes and num_blocks from the other fields, and returns the 64 header bytes.
std::string encode_kv_header(KvBlobHeader& h);

struct KvBlobView {
  KvBlobHeader header;
  std::string_view payload;  // exactly header.payload_bytes, into the parsed buffer
};

// Parses and checks a whole body: magic, version, sizes (every product overflow-checked against
// the bounds above and `max_bytes`), block count against the token count, payload length equal
// to the rest of the body. The error says which field is wrong and why.
std::expected<KvBlobView, std::string> parse_kv_blob(std::string_view body,
                                                     std::uint64_t max_bytes);

}  // namespace refengine

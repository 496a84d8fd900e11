#include "kv_transfer_format.hpp"

#include <fmt/format.h>

#include <cstring>

namespace refengine {
namespace {

template <class T>
void put(std::string& out, std::size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof v);  // the engine runs on little-endian hosts only
}

template <class T>
T get(std::string_view in, std::size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

}  // namespace

std::string encode_kv_header(KvBlobHeader& h) {
  h.num_blocks = h.block_size == 0 ? 0 : (h.token_count + h.block_size - 1) / h.block_size;
  h.payload_bytes = std::uint64_t(h.layer_end - h.layer_begin) * 2 * h.num_blocks * h.block_bytes();
  std::string out(kKvHeaderBytes, '\0');
  put<std::uint32_t>(out, 0, kKvMagic);
  put<std::uint16_t>(out, 4, kKvVersion);
  put<std::uint16_t>(out, 6, kKvHeaderBytes);
  put<std::uint64_t>(out, 8, h.request_id);
  put<std::uint32_t>(out, 16, h.layer_begin);
  put<std::uint32_t>(out, 20, h.layer_end);
  put<std::uint32_t>(out, 24, h.n_layer);
  put<std::uint32_t>(out, 28, h.n_head);
  put<std::uint32_t>(out, 32, h.head_dim);
  put<std::uint32_t>(out, 36, h.block_size);
  put<std::uint32_t>(out, 40, h.dtype);
  put<std::uint32_t>(out, 44, h.token_count);
  put<std::uint32_t>(out, 48, h.num_blocks);
  put<std::uint32_t>(out, 52, 0);  // flags: none defined in version 1
  put<std::uint64_t>(out, 56, h.payload_bytes);
  return out;
}

std::expected<KvBlobView, std::string> parse_kv_blob(std::string_view body,
                                                     std::uint64_t max_bytes) {
  auto bad = [](std::string why) { return std::unexpected("KV body: " + std::move(why)); };
  if (body.size() < kKvHeaderBytes)
    return bad(
        fmt::format("{} bytes, shorter than the {}-byte header", body.size(), kKvHeaderBytes));
  if (get<std::uint32_t>(body, 0) != kKvMagic) return bad("no THKV magic: not a KV-transfer body");
  if (const auto v = get<std::uint16_t>(body, 4); v != kKvVersion)
    return bad(fmt::format("version {}, this engine reads version {}", v, kKvVersion));
  if (const auto hb = get<std::uint16_t>(body, 6); hb != kKvHeaderBytes)
    return bad(
        fmt::format("header of {} bytes, version {} has {}", hb, kKvVersion, kKvHeaderBytes));
  KvBlobHeader h;
  h.request_id = get<std::uint64_t>(body, 8);
  h.layer_begin = get<std::uint32_t>(body, 16);
  h.layer_end = get<std::uint32_t>(body, 20);
  h.n_layer = get<std::uint32_t>(body, 24);
  h.n_head = get<std::uint32_t>(body, 28);
  h.head_dim = get<std::uint32_t>(body, 32);
  h.block_size = get<std::uint32_t>(body, 36);
  h.dtype = get<std::uint32_t>(body, 40);
  h.token_count = get<std::uint32_t>(body, 44);
  h.num_blocks = get<std::uint32_t>(body, 48);
  const auto flags = get<std::uint32_t>(body, 52);
  h.payload_bytes = get<std::uint64_t>(body, 56);
  if (flags != 0) return bad(fmt::format("flags {:#x}, version 1 defines none", flags));
  if (h.dtype != kKvDtypeF32)
    return bad(fmt::format("dtype {}, only 1 (fp32) is defined", h.dtype));
  if (h.n_layer == 0 || h.n_layer > kKvMaxLayers)
    return bad(fmt::format("n_layer {} is not in 1..{}", h.n_layer, kKvMaxLayers));
  if (h.layer_begin >= h.layer_end || h.layer_end > h.n_layer)
    return bad(fmt::format("layers [{}, {}) are not a non-empty range of the model's {}",
                           h.layer_begin, h.layer_end, h.n_layer));
  if (h.n_head == 0 || h.n_head > kKvMaxHeads)
    return bad(fmt::format("n_head {} is not in 1..{}", h.n_head, kKvMaxHeads));
  if (h.head_dim == 0 || h.head_dim > kKvMaxHeadDim)
    return bad(fmt::format("head_dim {} is not in 1..{}", h.head_dim, kKvMaxHeadDim));
  if (h.block_size == 0 || h.block_size > kKvMaxBlockSize)
    return bad(fmt::format("block_size {} is not in 1..{}", h.block_size, kKvMaxBlockSize));
  if (h.token_count == 0 || h.token_count > kKvMaxTokens)
    return bad(fmt::format("token_count {} is not in 1..{}", h.token_count, kKvMaxTokens));
  const std::uint32_t blocks = (h.token_count + h.block_size - 1) / h.block_size;
  if (h.num_blocks != blocks)
    return bad(fmt::format("{} blocks for {} tokens of block size {}: expected {}", h.num_blocks,
                           h.token_count, h.block_size, blocks));
  // Each factor is bounded above, so the product fits in 128 bits; compare there.
  const unsigned __int128 expect = (unsigned __int128)(h.layer_end - h.layer_begin) * 2 *
                                   h.num_blocks * h.n_head * h.block_size * h.head_dim *
                                   sizeof(float);
  if (expect != h.payload_bytes)
    return bad(fmt::format("payload_bytes {} does not match the shape ({} expected)",
                           h.payload_bytes, std::uint64_t(expect)));
  if (h.payload_bytes > max_bytes)
    return bad(
        fmt::format("{} bytes of blocks exceed the limit of {}", h.payload_bytes, max_bytes));
  if (body.size() - kKvHeaderBytes != h.payload_bytes)
    return bad(fmt::format("{} bytes follow the header, the header announces {}",
                           body.size() - kKvHeaderBytes, h.payload_bytes));
  return KvBlobView{h, body.substr(kKvHeaderBytes)};
}

}  // namespace refengine

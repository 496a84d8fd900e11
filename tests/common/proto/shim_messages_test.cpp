// The shim codec (common/proto/shim_messages.hpp): every message type round-trips with its
// descriptors; bodies with an unknown, missing or mistyped field, a value out of range, an
// unknown enum name or the wrong number of descriptors are refused with one printable line.
#include "common/proto/shim_messages.hpp"

#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "common/proto/shim_protocol.hpp"

namespace {

using namespace thaw::proto;
using thaw::UniqueFd;

UniqueFd some_fd() {
  return UniqueFd(::eventfd(0, EFD_CLOEXEC));
}

// `m` encoded, then decoded with the descriptors it carries (duplicated, as SCM_RIGHTS would).
Envelope round_trip(const ShimMessage& m, std::uint32_t id = 7) {
  std::vector<std::byte> bytes;
  std::vector<int> fds;
  const std::string e = encode_message(id, m, bytes, fds);
  EXPECT_EQ(e, "");
  std::vector<UniqueFd> received;
  for (int fd : fds) received.emplace_back(::dup(fd));
  Envelope out;
  EXPECT_EQ(decode_message(bytes, std::move(received), out), "");
  EXPECT_EQ(out.request_id, id);
  EXPECT_EQ(type_of(out.message), type_of(m));
  return out;
}

// A packet of `type` with `body`, decoded with `fd_count` descriptors: the error ("" = none).
std::string decode_raw(MessageType type, const nlohmann::json& body, std::size_t fd_count = 0,
                       bool* value_error = nullptr) {
  Message m;
  m.type = type;
  m.body = body;
  auto bytes = encode(m);
  EXPECT_TRUE(bytes);
  std::vector<UniqueFd> fds;
  for (std::size_t i = 0; i < fd_count; ++i) fds.push_back(some_fd());
  Envelope out;
  const std::string e = decode_message(*bytes, std::move(fds), out, value_error);
  for (char c : e) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << e;
  EXPECT_LT(e.size(), 1024u);
  return e;
}

TEST(ShimMessages, EveryTypeRoundTrips) {
  const ArtifactIdentity id{"/usr/bin/engine 123 4.5", "org/model", "NVIDIA H100", "12040"};
  std::vector<ShimMessage> all;
  all.emplace_back(Hello{"thaw-preload", "python3"});
  all.emplace_back(HelloOk{kProtocolVersion, "node-a", "0.1.0"});
  all.emplace_back(OpenFile{"gpt2", "onnx/model.safetensors"});
  all.emplace_back(File{123, true, some_fd(), some_fd()});
  all.emplace_back(AttachSlot{"gpt2"});
  all.emplace_back(
      Slot{"g0s1", ~0ull, 1 << 30, 1 << 20, 2 << 20, LayoutKind::engine, "abc", 42, 3, some_fd()});
  SlotPages pages;
  pages.offsets = {0, 2 << 20};
  pages.pages.push_back(some_fd());
  pages.pages.push_back(some_fd());
  all.emplace_back(std::move(pages));
  all.emplace_back(Imported{"g0s1", 99});
  all.emplace_back(Ok{});
  all.emplace_back(Release{"g0s1", true});
  all.emplace_back(ReportArtifact{ArtifactKind::layout, id, 10, some_fd()});
  all.emplace_back(Error::make("org.thaw.Error.NotReady", "not yet\nsecond line"));
  all.emplace_back(GetArtifact{ArtifactKind::layout, id});
  all.emplace_back(Artifact{10, some_fd()});
  all.emplace_back(ReportCounters{EngineCounters{1, 2, 3, 4, 5, kMaxCounter, 6, 7, 8, 9, 10}});
  all.emplace_back(ExportIpc{4096, some_fd()});
  all.emplace_back(IpcExported{1ull << 40});
  all.emplace_back(ImportIpc{1ull << 40});
  all.emplace_back(Ipc{4096, some_fd()});
  all.emplace_back(FreePages{"g0s1", {0, 4096}});
  all.emplace_back(LeaseMemory{"0123456789abcdef0123456789ABCDEF"});
  all.emplace_back(MemoryLease{1 << 30});
  ASSERT_EQ(all.size(), std::variant_size_v<ShimMessage>);
  for (const ShimMessage& m : all) {
    SCOPED_TRACE(std::string(to_string(type_of(m))));
    Envelope back = round_trip(m);
    std::visit(
        [](const auto& v) {
          std::size_t open = 0;
          (void)v;
          if constexpr (requires { v.data; }) open += v.data.valid() + v.readiness.valid();
          if constexpr (requires { v.document; }) open += v.document.valid();
          if constexpr (requires { v.handle; }) open += v.handle.valid();
          if constexpr (requires { v.layout; }) open += v.layout.valid();
          if constexpr (requires { v.pages; }) {
            for (const auto& p : v.pages) open += p.valid();
          }
          (void)open;
        },
        back.message);
  }
  const auto slot = std::get<Slot>(round_trip(all[5]).message);
  EXPECT_EQ(slot.token, ~0ull);
  EXPECT_EQ(slot.layout_kind, LayoutKind::engine);
  EXPECT_TRUE(slot.layout.valid());
  const auto p = std::get<SlotPages>(round_trip(all[6]).message);
  ASSERT_EQ(p.pages.size(), 2u);
  EXPECT_TRUE(p.pages[1].valid());
  EXPECT_EQ(p.offsets[1], 2u << 20);
  const auto counters = std::get<ReportCounters>(round_trip(all[14]).message).counters;
  EXPECT_EQ(counters.bytes_streamed, kMaxCounter);
  EXPECT_EQ(counters.layout_divergences, 3u);
  const auto error = std::get<Error>(round_trip(all[11]).message);
  EXPECT_EQ(error.message, "not yet second line");  // one line
  const auto artifact = std::get<ReportArtifact>(round_trip(all[10]).message);
  EXPECT_EQ(artifact.identity.gpu, "NVIDIA H100");
  EXPECT_TRUE(artifact.document.valid());
}

TEST(ShimMessages, DescriptorCountsAreExact) {
  const nlohmann::json file = {{"size", 1}, {"complete", false}};
  EXPECT_EQ(decode_raw(MessageType::file, file, 2), "");
  EXPECT_NE(decode_raw(MessageType::file, file, 1), "");
  EXPECT_NE(decode_raw(MessageType::file, file, 3), "");
  const nlohmann::json ipc = {{"bytes", 4096}};
  EXPECT_EQ(decode_raw(MessageType::export_ipc, ipc, 1), "");
  EXPECT_NE(decode_raw(MessageType::export_ipc, ipc, 0), "");
  EXPECT_NE(decode_raw(MessageType::export_ipc, ipc, 2), "");
  EXPECT_NE(decode_raw(MessageType::open_file, {{"model", "m"}, {"path", "p"}}, 1), "");
  const nlohmann::json pages = {{"pages", {0, 4096, 8192}}};
  EXPECT_EQ(decode_raw(MessageType::slot_pages, pages, 3), "");
  EXPECT_NE(decode_raw(MessageType::slot_pages, pages, 2), "");
  EXPECT_NE(decode_raw(MessageType::slot_pages, {{"pages", nlohmann::json::array()}}, 0), "");
  // Encoding checks them too: a missing descriptor is not sent as -1.
  std::vector<std::byte> bytes;
  std::vector<int> fds;
  EXPECT_NE(encode_message(1, ExportIpc{4096, UniqueFd()}, bytes, fds), "");
  SlotPages uneven;
  uneven.offsets = {0, 4096};
  uneven.pages.push_back(some_fd());
  EXPECT_NE(encode_message(1, std::move(uneven), bytes, fds), "");
}

TEST(ShimMessages, BodiesAreExact) {
  EXPECT_EQ(decode_raw(MessageType::open_file, {{"model", "m"}, {"path", "a/b"}}), "");
  // Unknown and missing fields, wrong JSON types.
  EXPECT_NE(decode_raw(MessageType::open_file, {{"model", "m"}, {"path", "p"}, {"x", 1}}), "");
  EXPECT_NE(decode_raw(MessageType::open_file, {{"model", "m"}}), "");
  EXPECT_NE(decode_raw(MessageType::open_file, {{"model", 42}, {"path", "p"}}), "");
  EXPECT_NE(decode_raw(MessageType::release, {{"slot", "s"}, {"handback", 1}}), "");
  EXPECT_NE(decode_raw(MessageType::imported, {{"slot", "s"}, {"token", -1}}), "");
  EXPECT_NE(decode_raw(MessageType::imported, {{"slot", "s"}, {"token", 1.5}}), "");
  // Strings: empty, too long, control characters, paths that leave the model directory.
  EXPECT_NE(decode_raw(MessageType::attach_slot, {{"model", ""}}), "");
  EXPECT_NE(decode_raw(MessageType::attach_slot, {{"model", std::string(kMaxNameBytes + 1, 'm')}}),
            "");
  EXPECT_NE(decode_raw(MessageType::attach_slot, {{"model", "a\nb"}}), "");
  for (const char* path : {"/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/"}) {
    EXPECT_NE(decode_raw(MessageType::open_file, {{"model", "m"}, {"path", path}}), "") << path;
  }
  // Enums.
  const nlohmann::json id = {{"engine", "e"}, {"model", "m"}, {"gpu", "g"}, {"driver", "1"}};
  EXPECT_EQ(decode_raw(MessageType::get_artifact, {{"kind", "layout"}, {"identity", id}}), "");
  EXPECT_EQ(decode_raw(MessageType::get_artifact, {{"kind", "kvcache"}, {"identity", id}}), "");
  EXPECT_EQ(decode_raw(MessageType::get_artifact, {{"kind", "graphs"}, {"identity", id}}), "");
  EXPECT_NE(decode_raw(MessageType::get_artifact, {{"kind", "../etc"}, {"identity", id}}), "");
  auto extra = id;
  extra["more"] = "x";
  EXPECT_NE(decode_raw(MessageType::get_artifact, {{"kind", "layout"}, {"identity", extra}}), "");
  EXPECT_NE(decode_raw(MessageType::lease_memory, {{"gpu_uuid", "GPU-0"}}), "");
  // Hello's names may hold anything (thawd logs them quoted).
  EXPECT_EQ(decode_raw(MessageType::hello, {{"client", "c"}, {"engine", "evil\nname"}}), "");
}

TEST(ShimMessages, ValuesOutOfRangeAreRequestErrors) {
  bool value_error = false;
  nlohmann::json counters = {{"calls_intercepted", 1ull << 63},
                             {"deterministic_allocations", 0},
                             {"layout_divergences", 0},
                             {"files_streamed", 0},
                             {"reads_waited", 0},
                             {"bytes_streamed", 0},
                             {"graph_records_stored", 0},
                             {"graphs_restored", 0},
                             {"graph_restore_fallbacks", 0},
                             {"kv_restores", 0},
                             {"kv_restore_fallbacks", 0}};
  EXPECT_NE(decode_raw(MessageType::report_counters, {{"counters", counters}}, 0, &value_error),
            "");
  EXPECT_TRUE(value_error) << "a number out of range is the request's fault, not the framing's";
  counters["calls_intercepted"] = kMaxCounter;
  EXPECT_EQ(decode_raw(MessageType::report_counters, {{"counters", counters}}), "");
  counters["kv_restore_fallbacks"] = kMaxCounter + 1;
  EXPECT_NE(decode_raw(MessageType::report_counters, {{"counters", counters}}, 0, &value_error),
            "");
  EXPECT_TRUE(value_error) << "the restores' counters have the same bound";
  counters["kv_restore_fallbacks"] = 0;
  // A version 4 report (without the restores' counters) is a missing field, as any.
  nlohmann::json v4 = counters;
  for (const char* name : {"graph_records_stored", "graphs_restored", "graph_restore_fallbacks",
                           "kv_restores", "kv_restore_fallbacks"}) {
    v4.erase(name);
  }
  EXPECT_NE(decode_raw(MessageType::report_counters, {{"counters", v4}}, 0, &value_error), "");
  EXPECT_FALSE(value_error) << "a missing field is malformed";
  counters.erase("reads_waited");
  EXPECT_NE(decode_raw(MessageType::report_counters, {{"counters", counters}}, 0, &value_error),
            "");
  EXPECT_FALSE(value_error) << "a missing field is malformed";
  EXPECT_NE(decode_raw(MessageType::export_ipc, {{"bytes", 0}}, 1, &value_error), "");
  EXPECT_TRUE(value_error);
  EXPECT_NE(decode_raw(MessageType::free_pages,
                       {{"slot", "s"}, {"offsets", std::vector<int>(kMaxFreePagesPerMessage + 1)}}),
            "");
}

TEST(ShimMessages, VersionTypeAndFrameAreChecked) {
  Message m;
  m.type = MessageType::ok;
  m.version = kProtocolVersion + 1;
  Envelope out;
  EXPECT_NE(decode_message(*encode(m), {}, out), "");
  m.version = kProtocolVersion;
  auto bytes = *encode(m);
  EXPECT_EQ(decode_message(bytes, {}, out), "");
  bytes[6] = std::byte{99};
  EXPECT_NE(decode_message(bytes, {}, out), "");
  FrameHeader h;
  FrameErrc code;
  EXPECT_NE(read_frame_header(std::span(bytes.data(), 10), h, code), "");
  EXPECT_EQ(code, FrameErrc::short_header);
}

TEST(ShimMessages, SlotLayoutRowsAreTyped) {
  const std::vector<LayoutRow> rows = {{0, "model.safetensors", 8, 100},
                                       {4096, "b/model-2.safetensors", 0, 7}};
  std::string text;
  ASSERT_EQ(encode_slot_layout(rows, text), "");
  std::vector<LayoutRow> back;
  ASSERT_EQ(decode_slot_layout(text, back), "");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].file, "b/model-2.safetensors");
  EXPECT_EQ(back[1].slot_offset, 4096u);
  EXPECT_EQ(back[0].file_offset, 8u);
  EXPECT_EQ(back[0].bytes, 100u);
  EXPECT_NE(decode_slot_layout(R"([[0, "f", 0, 1, -1]])", back), "");  // five fields
  EXPECT_NE(decode_slot_layout(R"([[0, "f", 0]])", back), "");
  EXPECT_NE(decode_slot_layout(R"([[0, "../f", 0, 1]])", back), "");
  EXPECT_NE(decode_slot_layout(R"({"rows": []})", back), "");
  EXPECT_TRUE(back.empty());
}

}  // namespace

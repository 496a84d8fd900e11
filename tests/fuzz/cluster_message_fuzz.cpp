// Fuzz target for the control plane's decode-and-validate path
// (common/proto/cluster/cluster_codec_core.hpp): the bytes a node, the coordinator or a
// frontend receives, fed to all four decoders.
//
// Built two ways (tests/fuzz/CMakeLists.txt):
//   cluster_message_fuzz         libFuzzer (clang -fsanitize=fuzzer); tests/fuzz/run-libfuzzer.sh.
//                                Half its mutations are libFuzzer's own, half structure-aware
//                                (below), which get past parsing to the semantic checks.
//   cluster_message_fuzz_replay  a plain program (THAW_FUZZ_REPLAY_MAIN) for any compiler: every
//                                file of the given corpus, then seeded mutations of it; ctest runs
//                                it. --write-seeds DIR writes the seed corpus (corpus/cluster/).
// Either way an input fails by crashing, by a sanitizer report, or by breaking one of the
// invariants below (__builtin_trap). Only the core is used: it builds with clang 14, which has
// no std::expected.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/proto/cluster/cluster_codec_core.hpp"

// The mutator parses inputs that are not UTF-8; protobuf 3.x would log a line for each.
#if __has_include(<google/protobuf/stubs/logging.h>)
#include <google/protobuf/stubs/logging.h>
#define THAW_FUZZ_HAVE_LOG_SILENCER 1
#endif

namespace {

namespace cluster = thaw::cluster;
namespace core = thaw::cluster::core;
namespace v1 = thaw::cluster::v1;
namespace pb = google::protobuf;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

// An error is one line of bounded length: the caller logs it as is, with the peer's name.
// (Each quoted peer string is at most 64 bytes, 4 x that escaped; a message quotes two.)
void check_error(const std::string& e, const pb::Message& out) {
  check(!e.empty());
  check(e.size() < 1024);
  for (char c : e) check(c >= 0x20 && c < 0x7f);
  check(out.ByteSizeLong() == 0);  // refused: nothing half-read is left behind
}

bool body_set(const v1::NodeMessage& m) {
  return m.body_case() != v1::NodeMessage::BODY_NOT_SET;
}
bool body_set(const v1::CoordinatorMessage& m) {
  return m.body_case() != v1::CoordinatorMessage::BODY_NOT_SET;
}
bool body_set(const v1::FrontendRequest& m) {
  return m.body_case() != v1::FrontendRequest::BODY_NOT_SET;
}
bool body_set(const v1::FrontendReply& m) {
  return m.body_case() != v1::FrontendReply::BODY_NOT_SET || !m.error().empty();
}

// What an accepted message guarantees beyond "the decoder said so": the rules that the
// validators apply in memory hold for its parts.
void check_accepted(const v1::NodeMessage& m) {
  if (m.has_register_()) {
    check(core::validate_node_id(m.register_().node_id()).empty());
    for (const v1::TaskStatus& t : m.register_().tasks())
      check(core::validate_task(t.task()).empty());
    for (const v1::GpuInfo& g : m.register_().gpus()) check(g.free_bytes() <= g.memory_bytes());
  }
  if (m.has_progress()) {
    check(core::validate_task(m.progress().task()).empty());
    check(m.progress().state() != v1::TASK_STATE_UNSPECIFIED);
  }
}
void check_accepted(const v1::CoordinatorMessage& m) {
  if (m.has_task()) {
    const v1::Task& t = m.task();
    check(core::validate_task(t).empty());
    check(t.stages() >= 1 && t.stage() < t.stages());
    check(cluster::task_kind_name(t.kind()) != "unknown");
  }
}
void check_accepted(const v1::FrontendRequest& m) {
  if (m.has_deploy()) {
    check(core::validate_model_spec(m.deploy().model()).empty());
    check(m.deploy().model().size_bytes() > 0);
  }
}
void check_accepted(const v1::FrontendReply& m) {
  if (m.has_deployed()) check(core::validate_model_spec(m.deployed()).empty());
}

// Decodes `bytes` as a Message; an accepted one must re-encode to bytes that decode again,
// to a message that encodes the same (so what a peer relays is what it received).
template <typename Message>
bool run_decoder(std::string_view bytes, std::size_t limit,
                 std::string (*decode)(std::string_view, Message&)) {
  Message m;
  const std::string e = decode(bytes, m);
  if (!e.empty()) {
    check_error(e, m);
    return false;
  }
  check(bytes.size() <= limit);
  check(m.version() == cluster::kProtocolVersion);
  check(body_set(m));
  check_accepted(m);
  const std::string again = cluster::encode(m);
  Message back;
  check(decode(again, back).empty());
  check(cluster::encode(back) == again);
  return true;
}

// Which decoders accepted an input (bit i: node, coordinator, request, reply).
unsigned run_all(std::string_view bytes) {
  unsigned accepted = 0;
  if (run_decoder<v1::NodeMessage>(bytes, cluster::kMaxInboundBytes, core::decode_node_message))
    accepted |= 1;
  if (run_decoder<v1::CoordinatorMessage>(bytes, cluster::kMaxInboundBytes,
                                          core::decode_coordinator_message))
    accepted |= 2;
  if (run_decoder<v1::FrontendRequest>(bytes, cluster::kMaxInboundBytes,
                                       core::decode_frontend_request))
    accepted |= 4;
  if (run_decoder<v1::FrontendReply>(bytes, cluster::kMaxReplyBytes, core::decode_frontend_reply))
    accepted |= 8;
  return accepted;
}

// ---- Structure-aware mutation ----
// Parses the input as one of the four messages and changes one field through reflection to a
// value at or past a rule's edge, then serialises: unlike byte flips, this reaches the semantic
// checks (stage vs stages, NaN SLOs, node id characters) with a message that still parses.

class StructureMutator {
 public:
  explicit StructureMutator(std::uint64_t seed) : rng_(seed) {}

  // False if `bytes` parses as none of the messages. Tried first as `prefer` (0 node, 1
  // coordinator, 2 request, 3 reply) when given, else as a random one.
  bool mutate(std::string& bytes, int prefer = -1) {
    v1::NodeMessage node;
    v1::CoordinatorMessage coordinator;
    v1::FrontendRequest request;
    v1::FrontendReply reply;
    pb::Message* const all[] = {&node, &coordinator, &request, &reply};
#ifdef THAW_FUZZ_HAVE_LOG_SILENCER
    pb::LogSilencer quiet;
#endif
    const std::size_t first =
        prefer >= 0 && prefer < 4 ? static_cast<std::size_t>(prefer) : below(4);
    for (std::size_t i = 0; i < 4; ++i) {
      pb::Message& m = *all[(first + i) % 4];
      if (!m.ParseFromString(bytes)) continue;
      const int n = 1 + static_cast<int>(below(3));
      for (int k = 0; k < n; ++k) mutate_message(m);
      bytes = m.SerializeAsString();
      return true;
    }
    return false;
  }

  std::uint64_t below(std::uint64_t n) {
    return n == 0 ? 0 : rng_() % n;
  }
  std::mt19937_64& rng() {
    return rng_;
  }

 private:
  struct Site {
    pb::Message* message;
    const pb::FieldDescriptor* field;
  };

  void collect(pb::Message& m, std::vector<Site>& sites, int depth) {
    const pb::Descriptor* d = m.GetDescriptor();
    const pb::Reflection* r = m.GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      sites.push_back({&m, f});
      if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE || depth > 6) continue;
      if (f->is_repeated()) {
        for (int j = 0; j < r->FieldSize(m, f); ++j)
          collect(*r->MutableRepeatedMessage(&m, f, j), sites, depth + 1);
      } else if (r->HasField(m, f)) {
        collect(*r->MutableMessage(&m, f), sites, depth + 1);
      }
    }
  }

  void mutate_message(pb::Message& root) {
    std::vector<Site> sites;
    collect(root, sites, 0);
    if (sites.empty()) return;
    const Site s = sites[below(sites.size())];
    pb::Message& m = *s.message;
    const pb::FieldDescriptor* f = s.field;
    const pb::Reflection* r = m.GetReflection();
    if (f->is_repeated() && f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
      // Repeated strings (a task's peers): drop one, add a mutated copy, or many (list limits).
      const int size = r->FieldSize(m, f);
      switch (below(3)) {
        case 0:
          if (size > 0) {
            r->RemoveLast(&m, f);
            break;
          }
          [[fallthrough]];
        case 1:
          r->AddString(&m, f, text(size > 0 ? r->GetRepeatedString(m, f, 0) : ""));
          break;
        default:
          for (int i = 0; i < 70; ++i)
            r->AddString(&m, f, size > 0 ? r->GetRepeatedString(m, f, 0) : "127.0.0.1:1");
          break;
      }
      return;
    }
    // Other repeated scalars: none in cluster.proto today; left alone rather than misread.
    if (f->is_repeated() && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) return;
    if (f->is_repeated()) {  // the other repeated fields of cluster.proto hold messages
      const int size = r->FieldSize(m, f);
      switch (below(3)) {
        case 0:
          if (size > 0) {
            r->RemoveLast(&m, f);
            break;
          }
          [[fallthrough]];
        case 1: {
          pb::Message* added = r->AddMessage(&m, f);
          if (size > 0) added->CopyFrom(r->GetRepeatedMessage(m, f, static_cast<int>(below(size))));
          break;
        }
        default:  // many of them (list limits)
          for (int i = 0; i < 70 && size > 0; ++i)
            r->AddMessage(&m, f)->CopyFrom(r->GetRepeatedMessage(m, f, 0));
          break;
      }
      return;
    }
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        // Setting an unset member of a oneof switches the body; clearing leaves it empty.
        if (r->HasField(m, f) && below(2) == 0) {
          r->ClearField(&m, f);
        } else {
          r->MutableMessage(&m, f);
        }
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(&m, f, static_cast<std::uint32_t>(integer(r->GetUInt32(m, f))));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(&m, f, integer(r->GetUInt64(m, f)));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(&m, f, static_cast<std::int32_t>(integer(r->GetInt32(m, f))));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(&m, f, static_cast<std::int64_t>(integer(r->GetInt64(m, f))));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(&m, f, real());
        break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(&m, f, static_cast<float>(real()));
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(&m, f, !r->GetBool(m, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        // proto3 enums are open: a newer peer's value must be refused, not misread.
        constexpr int kValues[] = {-1, 0, 1, 2, 3, 4, 5, 6, 100};
        r->SetEnumValue(&m, f, kValues[below(std::size(kValues))]);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_STRING:
        r->SetString(&m, f, text(r->GetString(m, f)));
        break;
    }
  }

  std::uint64_t integer(std::uint64_t now) {
    constexpr std::uint64_t kEdges[] = {
        0,          1,          2,           9,        10,
        63,         64,         65,          100,      100'000,
        100'001,    600'000,    600'001,     1u << 20, (1u << 20) + 1,
        0x7fffffff, 0xffffffff, 0x100000000, ~0ull};
    switch (below(4)) {
      case 0:
        return now + 1;
      case 1:
        return now - 1;
      case 2:
        return rng_() >> below(64);
      default:
        return kEdges[below(std::size(kEdges))];
    }
  }

  double real() {
    constexpr double kValues[] = {0.0,
                                  -0.0,
                                  -1.0,
                                  0.5,
                                  1e-300,
                                  1e300,
                                  std::numeric_limits<double>::denorm_min(),
                                  -std::numeric_limits<double>::denorm_min(),
                                  std::numeric_limits<double>::quiet_NaN(),
                                  -std::numeric_limits<double>::quiet_NaN(),
                                  std::numeric_limits<double>::infinity(),
                                  -std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::max()};
    return kValues[below(std::size(kValues))];
  }

  // Valid UTF-8 only (serialising a proto3 string that is not would be refused by the
  // sender's library, not by the decoder under test; byte mutations cover that case).
  std::string text(const std::string& now) {
    switch (below(12)) {
      case 0:
        return "";
      case 1:
        return " ";
      case 2:
        return now + " x";
      case 3:
        return now + "/x";
      case 4:
        return now + "\n";
      case 5:
        return std::string(64, 'n');
      case 6:
        return std::string(65, 'n');
      case 7:
        return std::string(256, 'm');
      case 8:
        return std::string(257, 'm');
      case 9:
        return now + "\xc3\xa9\x7f\"\\";
      case 10:
        return now.substr(0, below(now.size() + 1));
      default:
        return "node-" + std::to_string(below(10));
    }
  }

  std::mt19937_64 rng_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  run_all(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

#ifndef THAW_FUZZ_REPLAY_MAIN
extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

// Half libFuzzer's byte-level mutations, half structure-aware ones.
extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size,
                                               std::size_t max_size, unsigned int seed) {
  StructureMutator mutator(seed);
  if (mutator.below(2) == 0) return LLVMFuzzerMutate(data, size, max_size);
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (!mutator.mutate(bytes) || bytes.size() > max_size)
    return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, bytes.data(), bytes.size());
  return bytes.size();
}
#endif

#ifdef THAW_FUZZ_REPLAY_MAIN
#include "replay_corpus.hpp"

// ---- The replay program. ----
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <utility>

namespace {

using Bytes = std::string;

// ---- The seed corpus: valid messages of each kind ----

v1::ModelSpec seed_model() {
  v1::ModelSpec m;
  m.set_name("org/model-7b");
  m.set_size_bytes(14'000'000'000);
  m.set_layers(32);
  m.set_slo_ttft_s(2.5);
  m.set_slo_tpot_s(0.1);
  m.set_prefill_s(0.4);
  m.set_decode_s(0.02);
  return m;
}

v1::Task seed_task(v1::TaskKind kind) {
  v1::Task t;
  t.set_id(std::string("plan-3/1/") + std::string(cluster::task_kind_name(kind)));
  t.set_plan_id("plan-3");
  t.set_kind(kind);
  *t.mutable_model() = seed_model();
  t.set_stage(1);
  t.set_stages(2);
  t.set_gpu(1);
  t.set_layers(16);
  t.set_consolidate(kind == v1::TASK_FETCH);
  return t;
}

v1::TaskStatus seed_status() {
  v1::TaskStatus s;
  *s.mutable_task() = seed_task(v1::TASK_FETCH);
  s.set_state(v1::TASK_RUNNING);
  s.set_bytes_done(1 << 20);
  s.set_bytes_total(7'000'000'000);
  return s;
}

v1::Register seed_register() {
  v1::Register r;
  r.set_node_id("node-a");
  r.set_thaw_version("0.1.0");
  r.set_network_bytes_per_s(12.5e9);
  for (std::uint32_t i = 0; i < 2; ++i) {
    v1::GpuInfo* g = r.add_gpus();
    g->set_index(i);
    g->set_memory_bytes(40ull << 30);
    g->set_free_bytes(30ull << 30);
    g->set_pcie_bytes_per_s(25e9);
    g->set_runs_worker(i == 1);
  }
  v1::CachedModel* c = r.add_cache();
  c->set_key("org/model-7b");
  c->set_state("partial");
  c->set_fetched_bytes(7);
  c->set_total_bytes(14);
  v1::SlotInfo* s = r.add_slots();
  s->set_id("slot-0");
  s->set_gpu(0);
  s->set_model("org/model-7b");
  s->set_state("prewarmed");
  s->set_resident_bytes(1 << 20);
  *r.add_tasks() = seed_status();
  return r;
}

std::vector<std::pair<std::string, Bytes>> seeds() {
  std::vector<std::pair<std::string, Bytes>> out;
  {
    v1::NodeMessage m;
    *m.mutable_register_() = seed_register();
    out.emplace_back("node-register", cluster::encode(m));
    m.mutable_heartbeat()->set_sequence(41);
    out.emplace_back("node-heartbeat", cluster::encode(m));
    *m.mutable_progress() = seed_status();
    out.emplace_back("node-progress", cluster::encode(m));
  }
  {
    v1::CoordinatorMessage m;
    m.mutable_welcome()->set_heartbeat_interval_ms(1000);
    m.mutable_welcome()->set_liveness(3);
    out.emplace_back("coordinator-welcome", cluster::encode(m));
    m.mutable_heartbeat()->set_sequence(7);
    out.emplace_back("coordinator-heartbeat", cluster::encode(m));
    m.mutable_re_register()->set_reason("unknown node");
    out.emplace_back("coordinator-re-register", cluster::encode(m));
    *m.mutable_task() = seed_task(v1::TASK_FETCH);
    out.emplace_back("coordinator-task-fetch", cluster::encode(m));
    *m.mutable_task() = seed_task(v1::TASK_LAUNCH_WORKER);
    m.mutable_task()->set_full_memory(true);
    out.emplace_back("coordinator-task-launch", cluster::encode(m));
  }
  {
    v1::FrontendRequest m;
    *m.mutable_deploy()->mutable_model() = seed_model();
    out.emplace_back("request-deploy", cluster::encode(m));
    m.mutable_cold_start()->set_model("org/model-7b");
    out.emplace_back("request-cold-start", cluster::encode(m));
    m.mutable_load()->set_model("org/model-7b");
    m.mutable_load()->set_requests_per_s(3.5);
    out.emplace_back("request-load", cluster::encode(m));
    m.mutable_state();
    out.emplace_back("request-state", cluster::encode(m));
  }
  {
    v1::FrontendReply m;
    v1::Plan* p = m.mutable_plan();
    p->set_id("plan-3");
    p->set_model("org/model-7b");
    p->set_stages(2);
    p->set_predicted_ttft_s(1.9);
    p->set_predicted_tpot_s(0.05);
    p->set_meets_slo(true);
    for (std::uint32_t i = 0; i < 2; ++i) {
      v1::PlannedStage* s = p->add_placement();
      s->set_stage(i);
      s->set_node_id(i == 0 ? "node-a" : "node-b");
      s->set_fetch_state(v1::TASK_RUNNING);
      s->set_bytes_total(7'000'000'000);
    }
    out.emplace_back("reply-plan", cluster::encode(m));
    v1::NodeState* n = m.mutable_state()->add_nodes();
    n->set_node_id("node-a");
    n->set_alive(true);
    n->set_seconds_since_heard(0.5);
    *n->mutable_report() = seed_register();
    *m.mutable_state()->add_models() = seed_model();
    out.emplace_back("reply-state", cluster::encode(m));
    *m.mutable_deployed() = seed_model();
    out.emplace_back("reply-deployed", cluster::encode(m));
    m.Clear();
    m.set_error("model org/x is not deployed");
    out.emplace_back("reply-error", cluster::encode(m));
  }
  return out;
}

// ---- Byte-level mutation, and the run ----

void mutate_bytes(Bytes& b, StructureMutator& m, const std::vector<Bytes>& corpus) {
  auto& rng = m.rng();
  if (b.empty()) {
    b.assign(1 + m.below(8), static_cast<char>(rng()));
    return;
  }
  switch (m.below(9)) {
    case 0:  // flip a bit
      b[m.below(b.size())] ^= static_cast<char>(1u << m.below(8));
      break;
    case 1: {  // a byte that matters to the wire format: varint continuation, wire types
      constexpr char kBytes[] = {'\x00', '\x01', '\x7f', '\x80', '\xff', '\x08', '\x0a', '\x12'};
      b[m.below(b.size())] = kBytes[m.below(std::size(kBytes))];
      break;
    }
    case 2:  // truncate
      b.resize(m.below(b.size() + 1));
      break;
    case 3: {  // duplicate a chunk (repeated fields, a oneof set twice)
      const std::size_t from = m.below(b.size());
      const std::size_t len = std::min<std::size_t>(m.below(64) + 1, b.size() - from);
      const Bytes chunk = b.substr(from, len);
      b.insert(m.below(b.size() + 1), chunk);
      break;
    }
    case 4: {  // erase a chunk
      const std::size_t at = m.below(b.size());
      b.erase(at, std::min<std::size_t>(m.below(16) + 1, b.size() - at));
      break;
    }
    case 5:  // append another message: protobuf merges concatenated messages
      b += corpus[m.below(corpus.size())];
      break;
    case 6:  // random bytes inserted
      b.insert(m.below(b.size() + 1), Bytes(1 + m.below(4), static_cast<char>(rng())));
      break;
    default:  // a random byte
      b[m.below(b.size())] = static_cast<char>(rng());
      break;
  }
}

struct Outcomes {
  long accepted = 0, refused = 0;
  std::map<std::string, long> rules;  // refusals by rule (numbers and quoted names elided)
};

// A corpus file's kind, from its name as --write-seeds spells it: the decoder whose verdict
// the replay tallies (all four run on every input regardless). Other files count as node
// messages.
constexpr std::string_view kKinds[] = {"node-", "coordinator-", "request-", "reply-"};
int kind_of(const std::filesystem::path& file) {
  const std::string name = file.filename().string();
  for (int k = 0; k < 4; ++k)
    if (name.starts_with(kKinds[k])) return k;
  return 0;
}

std::string decode_as(int kind, std::string_view bytes) {
  v1::NodeMessage node;
  v1::CoordinatorMessage coordinator;
  v1::FrontendRequest request;
  v1::FrontendReply reply;
  switch (kind) {
    case 1:
      return core::decode_coordinator_message(bytes, coordinator);
    case 2:
      return core::decode_frontend_request(bytes, request);
    case 3:
      return core::decode_frontend_reply(bytes, reply);
    default:
      return core::decode_node_message(bytes, node);
  }
}

// The rule an error names: its text with quoted strings and numbers (nan, inf, 0x0a and the
// like too) elided, so each rule counts once however many values reached it.
std::string rule_of(const std::string& e) {
  std::string unquoted;
  for (std::size_t i = 0; i < e.size(); ++i) {
    if (e[i] != '"') {
      unquoted += e[i];
      continue;
    }
    const std::size_t end = e.find('"', i + 1);
    if (end == std::string::npos) break;
    unquoted += "\"...\"";
    i = end;
    if (e.compare(i + 1, 3, "...") == 0) i += 3;
  }
  std::string out;
  std::size_t at = 0;
  while (at < unquoted.size()) {
    std::size_t end = unquoted.find(' ', at);
    if (end == std::string::npos) end = unquoted.size();
    std::string word = unquoted.substr(at, end - at);
    std::size_t lead = 0, trail = word.size();
    while (lead < trail && word[lead] == '(') ++lead;
    while (trail > lead && (word[trail - 1] == ')' || word[trail - 1] == ',' ||
                            word[trail - 1] == ':' || word[trail - 1] == ';')) {
      --trail;
    }
    const std::string core_word = word.substr(lead, trail - lead);
    char* parsed_to = nullptr;
    if (!core_word.empty()) (void)std::strtod(core_word.c_str(), &parsed_to);
    if (!core_word.empty() && parsed_to == core_word.c_str() + core_word.size()) {
      word = word.substr(0, lead) + "N" + word.substr(trail);
    }
    out += word;
    if (end < unquoted.size()) out += ' ';
    at = end + 1;
  }
  return out;
}

int write_seeds(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const auto& [name, bytes] : seeds()) {
    // Each seed must be accepted by the decoder of its kind, or it seeds nothing useful.
    check(decode_as(kind_of(name), bytes).empty());
    std::ofstream out(dir / (name + ".bin"), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cluster_message_fuzz_replay: cannot write %s\n", dir.c_str());
      return 1;
    }
  }
  std::printf("cluster_message_fuzz_replay: %zu seeds written to %s\n", seeds().size(),
              dir.c_str());
  return 0;
}

// Runs one input from a buffer of exactly its size, so ASan sees any read past the end.
void run(const Bytes& input, int kind, Outcomes& o) {
  const std::vector<std::uint8_t> exact(input.begin(), input.end());
  const std::uint8_t* data = exact.empty() ? nullptr : exact.data();
  LLVMFuzzerTestOneInput(data, exact.size());
  const std::string_view bytes(reinterpret_cast<const char*>(data), exact.size());
  if (const std::string e = decode_as(kind, bytes); e.empty()) {
    ++o.accepted;
  } else {
    ++o.refused;
    const std::string_view prefix = kKinds[kind];
    ++o.rules[std::string(prefix.substr(0, prefix.size() - 1)) + ": " + rule_of(e)];
  }
}

int usage() {
  std::fprintf(stderr,
               "usage: cluster_message_fuzz_replay [--mutations N] [--seed S] <file or dir>...\n"
               "       cluster_message_fuzz_replay --write-seeds DIR\n"
               "Runs every file (directories: their regular files) through the cluster message\n"
               "fuzz target, then N (default 20000) random mutations of them from seed S; or\n"
               "writes the seed corpus (valid messages of each kind) to DIR.\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--write-seeds") return write_seeds(argv[2]);
  const auto args = thaw::fuzz::parse_replay_args(argc, argv);
  if (!args) return usage();
  const long mutations = args->mutations;
  const std::uint64_t seed = args->seed;
  const auto files = thaw::fuzz::corpus_files(args->paths, "cluster_message_fuzz_replay");
  if (files.empty()) return 2;
  std::vector<Bytes> corpus;
  std::vector<int> kinds;
  for (const auto& f : files) {
    corpus.push_back(thaw::fuzz::read_file<Bytes>(f));
    kinds.push_back(kind_of(f));
  }

  const auto start = std::chrono::steady_clock::now();
  Outcomes seeds, mutants;
  for (std::size_t i = 0; i < corpus.size(); ++i) run(corpus[i], kinds[i], seeds);
  StructureMutator m(seed);
  for (long i = 0; i < mutations; ++i) {
    const std::size_t from = static_cast<std::size_t>(i) % corpus.size();
    Bytes b = corpus[from];
    // Mostly structure-aware (the semantic checks), the rest byte-level (the parser).
    const std::uint64_t how = m.below(4);
    if (how != 0 && !m.mutate(b, kinds[from])) mutate_bytes(b, m, corpus);
    if (how == 0 || m.below(4) == 0) mutate_bytes(b, m, corpus);
    run(b, kinds[from], mutants);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "cluster_message_fuzz_replay: %zu corpus files (%ld accepted, %ld refused), %ld mutations "
      "(seed %#llx: %ld accepted, %ld refused): no failure in %.1f s\n",
      corpus.size(), seeds.accepted, seeds.refused, mutations,
      static_cast<unsigned long long>(seed), mutants.accepted, mutants.refused, s);
  // Which rules the mutants reached (as their seed's decoder words them), so a corpus or
  // mutator change that stops exercising one shows here.
  std::printf("cluster_message_fuzz_replay: %zu rules reached by refused mutants:\n",
              mutants.rules.size());
  for (const auto& [rule, n] : mutants.rules) std::printf("  %6ld  %s\n", n, rule.c_str());
  return 0;
}
#endif  // THAW_FUZZ_REPLAY_MAIN

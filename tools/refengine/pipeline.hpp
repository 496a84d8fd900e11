// Pipeline-parallel stages over TCP. Stages form a ring: stage k accepts a connection from
// stage k-1 and connects to stage k+1 (the last stage connects to stage 0). Stage 0 schedules;
// each step travels 0 -> 1 -> ... -> n-1 with the hidden states, and the last stage sends the
// sampled tokens back to stage 0. Messages are length-prefixed little-endian records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "step.hpp"

namespace refengine {

struct PipelineConfig {
  int rank = 0;
  int size = 1;
  std::vector<std::string> peers;  // host:port of every stage, by rank (its listening address)
  int connect_timeout_s = 60;
};

class PipelineLink {
 public:
  // Listens on peers[rank], connects to peers[(rank + 1) % size] (retrying until the timeout)
  // and accepts the previous stage's connection. Throws with the address on failure.
  explicit PipelineLink(const PipelineConfig& config);
  ~PipelineLink();
  PipelineLink(const PipelineLink&) = delete;
  PipelineLink& operator=(const PipelineLink&) = delete;

  enum class Kind : std::uint32_t { kHello = 1, kStep = 2, kResult = 3, kShutdown = 4 };

  // Start-up handshake around the ring: every stage contributes its KV block count; stage 0
  // gets the minimum (the blocks every stage has). `model_signature` must match everywhere.
  int agree_num_blocks(int own_blocks, const std::string& model_signature);

  void send_step(const StepBatch& b, const std::vector<float>& hidden);
  void send_result(const StepResult& r);
  void send_shutdown();
  // Receives the next message from the previous stage; fills what it carries.
  Kind receive(StepBatch* b, std::vector<float>* hidden, StepResult* r);

 private:
  void send(Kind kind, const std::string& payload);
  PipelineConfig config_;
  int listen_fd_ = -1, next_fd_ = -1, prev_fd_ = -1;
};

}  // namespace refengine

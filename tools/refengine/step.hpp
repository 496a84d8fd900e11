// One engine step as the model runner executes it: a flat batch of tokens from one or more
// sequences (vLLM's "flattened" input), with the paged-KV metadata the kernels read. The same
// struct travels between pipeline stages (pipeline.hpp).
#pragma once

#include <cstdint>
#include <vector>

namespace refengine {

struct StepBatch {
  int num_tokens = 0;  // rows of the flat batch (padded up to graph_size in graph mode)
  int num_seqs = 0;    // sequences (padded likewise)
  int graph_size = 0;  // decode batch size of the CUDA graph to replay; 0: run eagerly
  // Logits come back for: 0 = the sampled rows only (last token of each sequence), 1 = every
  // row (prefill scoring, --all-positions).
  int logits_rows_mode = 0;
  bool want_logits = false;                // copy the logits of those rows back to the host
  std::vector<std::int32_t> tokens;        // [num_tokens]
  std::vector<std::int32_t> positions;     // [num_tokens]
  std::vector<std::int32_t> slots;         // [num_tokens] KV slot, -1 for padding
  std::vector<std::int32_t> query_seq;     // [num_tokens] index of the token's sequence
  std::vector<std::int32_t> context_lens;  // [num_seqs]
  std::vector<std::int32_t> block_tables;  // [num_seqs * max_blocks_per_seq]
  std::vector<std::int32_t> last_rows;     // [num_seqs] row of each sequence's last token
};

struct StepResult {
  std::vector<std::int32_t> next_tokens;  // [num_seqs] greedy choice per sequence
  int logits_rows = 0;
  std::vector<float> logits;  // [logits_rows * vocab] when want_logits
};

}  // namespace refengine

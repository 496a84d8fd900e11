// What one pipeline stage of a model must fetch: whole small files, and byte ranges of the
// weight files (each range naming the tensors it holds), in the order to fetch them.
//
// Stage k of n gets layers [floor(k*L/n), floor((k+1)*L/n)): contiguous, sizes differing by
// at most one, the larger stages last. Stage 0 also gets the token embedding and the other
// input tensors (position embeddings, OPT's project_in); stage n-1 the final norm (and OPT's
// project_out), the LM head, and, when the head is tied (LayerLayout::tied_lm_head), the token
// embedding as well: the one tensor two stages fetch.
//
// Every stage fetches every small file and every weight file's header [0, 8 + N), because
// every reader (safetensors' safe_open, vLLM's loaders, the reference engine) parses the header
// of each file it opens before reading a tensor.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <vector>

#include "common/safetensors/error.hpp"
#include "common/safetensors/model.hpp"

namespace thaw::safetensors {

struct ByteRange {
  std::uint64_t begin = 0;  // absolute file offsets, [begin, end), never empty
  std::uint64_t end = 0;
  // The tensors whose bytes make up the range, in file order. A weight file's header range
  // lists the stage's zero-size tensors (they are complete as soon as the header is).
  std::vector<std::string> tensors;
};

struct FileFetch {
  std::string file;        // relative to the model directory
  std::uint64_t size = 0;  // the whole file's size
  bool whole = false;      // a small file: fetched whole (ranges holds [0, size) unless empty)
  // Weight files: ranges[0] is the header [0, 8 + N); then the stage's tensors, adjacent ones
  // merged into one range. Sorted, disjoint; only the header may touch the next range.
  std::vector<ByteRange> ranges;

  std::uint64_t bytes() const;
};

struct FetchPlan {
  int stage = 0;
  int num_stages = 1;
  int layer_begin = 0;  // the stage's layers: [layer_begin, layer_end)
  int layer_end = 0;
  bool has_embedding = false;   // the first stage's token embedding and input tensors
  bool has_final = false;       // the last stage's final norm and LM head
  bool tied_embedding = false;  // the last stage also holds the token embedding (tied LM head)
  // Small files first (config.json, then the others by name), then the weight files in
  // the model's order. Every weight file appears, if only for its header.
  std::vector<FileFetch> files;

  std::uint64_t bytes() const;
  // Every tensor the plan covers, in plan order.
  std::vector<std::string> tensors() const;
};

struct LayerSpan {
  int begin = 0;
  int end = 0;
};
// [floor(stage*num_layers/num_stages), floor((stage+1)*num_layers/num_stages)).
// Requires 0 <= stage < num_stages.
LayerSpan stage_layers(int stage, int num_stages, int num_layers);

// The plan for stage `stage` of `num_stages` (infer_layout's errors, and invalid_stage unless
// 0 <= stage < num_stages <= num_layers: every stage gets at least one layer).
std::expected<FetchPlan, Error> plan_stage(const Model& model, int stage, int num_stages);

// Everything: every small file and every weight file, as header + data ranges. Needs no
// layer inference, so it works for any family (layer_begin = layer_end = 0: not inferred).
FetchPlan plan_full(const Model& model);

}  // namespace thaw::safetensors

// GPT-2's byte-level BPE tokenizer (vocab.json + merges.txt of a Hugging Face model
// directory). Pre-tokenization follows GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with one simplification: every non-ASCII code point counts as a letter (\p{L}), so text in
// scripts with their own digits or punctuation may split differently from Hugging Face's.
#pragma once

#include <cstdint>
#include <expected>
#include <filesystem>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace refengine {

class Tokenizer {
 public:
  // Fails when vocab.json or merges.txt is missing or malformed.
  static std::expected<Tokenizer, std::string> open(const std::filesystem::path& model_dir);

  std::vector<std::int32_t> encode(const std::string& text) const;
  // Unknown ids decode as U+FFFD.
  std::string decode(const std::vector<std::int32_t>& ids) const;

 private:
  std::vector<std::string> bpe(const std::string& word) const;

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::unordered_map<std::int32_t, std::string> inverse_;
  std::map<std::pair<std::string, std::string>, int> merge_rank_;
  std::string byte_to_unicode_[256];
  std::unordered_map<std::string, unsigned char> unicode_to_byte_;
  std::int32_t unk_ = -1;
};

}  // namespace refengine

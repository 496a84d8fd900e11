#include "tokenizer.hpp"

#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

namespace refengine {
namespace {

std::string utf8(unsigned cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// Splits a UTF-8 string into code points (as strings); invalid bytes stand alone.
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

enum class Class { kLetter, kNumber, kSpace, kOther };
Class classify(const std::string& cp) {
  const unsigned char c = static_cast<unsigned char>(cp[0]);
  if (c >= 0x80) return Class::kLetter;  // the documented simplification
  if (std::isalpha(c)) return Class::kLetter;
  if (std::isdigit(c)) return Class::kNumber;
  if (std::isspace(c)) return Class::kSpace;
  return Class::kOther;
}

// GPT-2's pre-tokenization (see the header).
std::vector<std::string> pre_tokenize(const std::string& text) {
  const auto cps = code_points(text);
  std::vector<std::string> words;
  std::size_t i = 0;
  auto run = [&](std::size_t from, Class k) {
    std::size_t j = from;
    while (j < cps.size() && classify(cps[j]) == k) ++j;
    return j;
  };
  while (i < cps.size()) {
    if (cps[i] == "'" && i + 1 < cps.size()) {  // contractions
      static const char* kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
      bool matched = false;
      for (const char* suf : kSuffixes) {
        const std::size_t n = std::char_traits<char>::length(suf);
        std::string next;
        for (std::size_t k = 0; k < n && i + 1 + k < cps.size(); ++k) next += cps[i + 1 + k];
        if (next == suf) {
          words.push_back("'" + next);
          i += 1 + n;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    const bool space_prefix =
        cps[i] == " " && i + 1 < cps.size() && classify(cps[i + 1]) != Class::kSpace;
    const std::size_t start = i;
    const std::size_t body = space_prefix ? i + 1 : i;
    const Class k = classify(cps[body]);
    std::size_t end;
    if (k == Class::kSpace) {
      // \s+(?!\S): a run of spaces leaves its last one to prefix the next word.
      end = run(body, Class::kSpace);
      if (end < cps.size() && end - body > 1) --end;
    } else {
      end = run(body, k);
    }
    std::string w;
    for (std::size_t j = start; j < end; ++j) w += cps[j];
    words.push_back(w);
    i = end;
  }
  return words;
}

}  // namespace

std::expected<Tokenizer, std::string> Tokenizer::open(const std::filesystem::path& dir) {
  Tokenizer t;
  std::ifstream vf(dir / "vocab.json");
  if (!vf) return std::unexpected(fmt::format("{}: not found", (dir / "vocab.json").string()));
  nlohmann::json vocab;
  try {
    vf >> vocab;
  } catch (const std::exception& e) {
    return std::unexpected(fmt::format("{}: {}", (dir / "vocab.json").string(), e.what()));
  }
  if (!vocab.is_object())
    return std::unexpected(fmt::format("{}: not a JSON object", (dir / "vocab.json").string()));
  for (auto& [k, v] : vocab.items()) {
    if (!v.is_number_integer())
      return std::unexpected(
          fmt::format("{}: id of '{}' is not an integer", (dir / "vocab.json").string(), k));
    t.vocab_[k] = v.get<std::int32_t>();
    t.inverse_[v.get<std::int32_t>()] = k;
  }
  if (auto it = t.vocab_.find("<unk>"); it != t.vocab_.end()) t.unk_ = it->second;
  std::ifstream mf(dir / "merges.txt");
  if (!mf) return std::unexpected(fmt::format("{}: not found", (dir / "merges.txt").string()));
  std::string line;
  int rank = 0;
  while (std::getline(mf, line)) {
    if (line.empty() || line.starts_with("#version")) continue;
    std::istringstream ls(line);
    std::string a, b;
    if (!(ls >> a >> b))
      return std::unexpected(
          fmt::format("{}: malformed merge '{}'", (dir / "merges.txt").string(), line));
    t.merge_rank_.emplace(std::pair{a, b}, rank++);
  }
  // GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
  unsigned next = 256;
  for (unsigned b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    t.byte_to_unicode_[b] = utf8(printable ? b : next++);
    t.unicode_to_byte_[t.byte_to_unicode_[b]] = static_cast<unsigned char>(b);
  }
  return t;
}

std::vector<std::string> Tokenizer::bpe(const std::string& word) const {
  std::vector<std::string> parts = code_points(word);
  while (parts.size() > 1) {
    int best = std::numeric_limits<int>::max();
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = merge_rank_.find({parts[i], parts[i + 1]});
      if (it != merge_rank_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == std::numeric_limits<int>::max()) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + long(at) + 1);
  }
  return parts;
}

std::vector<std::int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<std::int32_t> ids;
  for (const std::string& word : pre_tokenize(text)) {
    std::string mapped;
    for (unsigned char c : word) mapped += byte_to_unicode_[c];
    for (const std::string& piece : bpe(mapped)) {
      auto it = vocab_.find(piece);
      if (it != vocab_.end()) {
        ids.push_back(it->second);
      } else if (unk_ >= 0) {
        ids.push_back(unk_);
      } else {
        throw std::runtime_error(fmt::format("tokenizer: '{}' is not in vocab.json", piece));
      }
    }
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::int32_t id : ids) {
    auto it = inverse_.find(id);
    if (it == inverse_.end()) {
      out += "\xEF\xBF\xBD";
      continue;
    }
    for (const std::string& cp : code_points(it->second)) {
      auto b = unicode_to_byte_.find(cp);
      out += b != unicode_to_byte_.end() ? std::string(1, char(b->second)) : cp;
    }
  }
  return out;
}

}  // namespace refengine

#include "common/safetensors/model.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "common/safetensors/header.hpp"
#include "common/safetensors/index.hpp"
#include "common/safetensors/unique_fd.hpp"

namespace thaw::safetensors {

namespace fs = std::filesystem;

bool is_small_model_file(std::string_view name) {
  if (name.empty() || name.starts_with(".")) return false;
  for (const std::string_view ext : {".json", ".txt", ".model", ".tiktoken", ".jinja", ".py"}) {
    if (name.ends_with(ext)) return true;
  }
  return false;
}

namespace {

// A whole small file, at most `limit` bytes (config and index files are kilobytes; the limit
// only stops a mistaken multi-gigabyte read).
std::expected<std::string, Error> read_text_file(const fs::path& path, std::uint64_t limit) {
  const auto fail = [&](std::string_view step, int err) {
    return std::unexpected(
        Error{errc::io, fmt::format("{}: {}: {}", path.string(), step, std::strerror(err))});
  };
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return fail("open", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail("fstat", errno);
  if (static_cast<std::uint64_t>(st.st_size) > limit) {
    return std::unexpected(Error{errc::io, fmt::format("{}: {} bytes, more than the {} a model's "
                                                       "metadata file may have",
                                                       path.string(), st.st_size, limit)});
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t r = ::read(fd.get(), text.data() + done, text.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return fail("read", errno);
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  text.resize(done);
  return text;
}

constexpr std::uint64_t kMetadataFileLimit = 64ull << 20;

std::string index_label(const ModelParts& parts) {
  return fmt::format("{}/{}", parts.label, kIndexFileName);
}

}  // namespace

std::expected<Model, Error> Model::open(const fs::path& dir) {
  ModelParts parts;
  parts.label = dir.string();

  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    return std::unexpected(Error{errc::io, fmt::format("{}: cannot list the model directory: {}",
                                                       parts.label, ec.message())});
  }
  bool has_single = false, has_index = false;
  for (const fs::directory_entry& entry : it) {
    std::error_code sec;
    if (!entry.is_regular_file(sec)) continue;  // follows symlinks (the HF cache's blobs)
    const std::string name = entry.path().filename().string();
    has_single |= name == kSingleFileName;
    has_index |= name == kIndexFileName;
    if (is_small_model_file(name)) {
      parts.small_files.push_back(FileEntry{name, entry.file_size(sec)});
    }
  }

  if (fs::is_regular_file(dir / kConfigFileName, ec)) {
    auto text = read_text_file(dir / kConfigFileName, kMetadataFileLimit);
    if (!text) return std::unexpected(text.error());
    parts.config_json = std::move(*text);
  }

  std::vector<std::string> weight_files;
  if (has_single) {  // transformers prefers it, ignoring an index next to it
    weight_files.emplace_back(kSingleFileName);
  } else if (has_index) {
    auto text = read_text_file(dir / kIndexFileName, kMetadataFileLimit);
    if (!text) return std::unexpected(text.error());
    auto index = parse_index(*text, index_label(parts));
    if (!index) return std::unexpected(index.error());
    for (const std::string& file : index->files) {
      if (!fs::is_regular_file(dir / file, ec)) {
        const auto tensor = std::find_if(index->weight_map.begin(), index->weight_map.end(),
                                         [&](const auto& e) { return e.second == file; });
        return std::unexpected(
            Error{errc::index_missing_shard,
                  fmt::format("{}: maps tensor {} to shard {}, which is not in the directory",
                              index_label(parts), quote_name(tensor->first), quote_name(file))});
      }
    }
    weight_files = index->files;
    parts.index_json = std::move(*text);
  } else {
    return std::unexpected(
        Error{errc::no_weights, fmt::format("{}: neither {} nor {} is in the directory",
                                            parts.label, kSingleFileName, kIndexFileName)});
  }

  for (const std::string& file : weight_files) {
    auto header = read_header(dir / file, file);
    if (!header) {
      // The message starts with the file's name; make it the full path.
      Error e = std::move(header.error());
      e.message = fmt::format("{}/{}", parts.label, e.message);
      return std::unexpected(std::move(e));
    }
    parts.shards.push_back(std::move(*header));
  }
  return assemble(std::move(parts));
}

std::expected<Model, Error> Model::assemble(ModelParts parts) {
  const auto fail = [](errc code, std::string message) {
    return std::unexpected(Error{code, std::move(message)});
  };
  Model m;
  m.label_ = std::move(parts.label);

  if (parts.config_json) {
    auto config =
        parse_model_config(*parts.config_json, fmt::format("{}/{}", m.label_, kConfigFileName));
    if (!config) return std::unexpected(config.error());
    m.config_ = std::move(*config);
  }
  if (parts.shards.empty()) {
    return fail(errc::no_weights, fmt::format("{}: the model has no safetensors file", m.label_));
  }
  std::sort(parts.shards.begin(), parts.shards.end(),
            [](const Header& a, const Header& b) { return a.file() < b.file(); });
  for (const Header& shard : parts.shards) {
    if (const auto why = core::shard_name_problem(shard.file())) {
      return fail(errc::invalid_index,
                  fmt::format("{}: weight file {} {}", m.label_, quote_name(shard.file()), *why));
    }
  }
  for (std::size_t i = 1; i < parts.shards.size(); ++i) {
    if (parts.shards[i].file() == parts.shards[i - 1].file()) {
      return fail(errc::invalid_index, fmt::format("{}: shard {} is given twice", m.label_,
                                                   quote_name(parts.shards[i].file())));
    }
  }

  if (parts.index_json) {
    const std::string label = fmt::format("{}/{}", m.label_, kIndexFileName);
    auto index = parse_index(*parts.index_json, label);
    if (!index) return std::unexpected(index.error());
    const auto shard_named = [&](std::string_view file) -> const Header* {
      const auto it =
          std::lower_bound(parts.shards.begin(), parts.shards.end(), file,
                           [](const Header& h, std::string_view f) { return h.file() < f; });
      return it != parts.shards.end() && it->file() == file ? &*it : nullptr;
    };
    for (const auto& [tensor, file] : index->weight_map) {
      const Header* shard = shard_named(file);
      if (!shard) {
        return fail(errc::index_missing_shard,
                    fmt::format("{}: maps tensor {} to shard {}, which the model does not have",
                                label, quote_name(tensor), quote_name(file)));
      }
      if (!shard->find(tensor)) {
        return fail(errc::index_tensor_missing,
                    fmt::format("{}: maps tensor {} to shard {}, whose header does not hold it",
                                label, quote_name(tensor), quote_name(file)));
      }
    }
    for (const Header& shard : parts.shards) {
      if (!std::binary_search(index->files.begin(), index->files.end(), shard.file())) {
        return fail(
            errc::index_tensor_unlisted,
            fmt::format(
                "{}: shard {} is not named by the index{}", label, quote_name(shard.file()),
                shard.tensors().empty()
                    ? std::string()
                    : fmt::format(" (it holds tensor {})", quote_name(shard.tensors()[0].name))));
      }
      for (const TensorInfo& t : shard.tensors()) {
        const std::string* listed = index->shard_of(t.name);
        if (!listed) {
          return fail(errc::index_tensor_unlisted,
                      fmt::format("{}/{}: tensor {} is not in the index", m.label_, shard.file(),
                                  quote_name(t.name)));
        }
        if (*listed != shard.file()) {
          return fail(errc::index_tensor_unlisted,
                      fmt::format("{}/{}: tensor {} is mapped to shard {} by the index", m.label_,
                                  shard.file(), quote_name(t.name), quote_name(*listed)));
        }
      }
    }
    m.index_ = std::move(*index);
  } else if (parts.shards.size() > 1) {
    return fail(errc::invalid_index,
                fmt::format("{}: {} safetensors files ({}, {}, ...) but no {} says which tensor "
                            "is where",
                            m.label_, parts.shards.size(), quote_name(parts.shards[0].file()),
                            quote_name(parts.shards[1].file()), kIndexFileName));
  }

  m.shards_ = std::move(parts.shards);
  m.small_files_ = std::move(parts.small_files);
  std::sort(m.small_files_.begin(), m.small_files_.end(),
            [](const FileEntry& a, const FileEntry& b) { return a.name < b.name; });

  for (std::uint32_t s = 0; s < m.shards_.size(); ++s) {
    for (std::uint32_t t = 0; t < m.shards_[s].tensors().size(); ++t) m.by_name_.push_back({s, t});
  }
  std::sort(m.by_name_.begin(), m.by_name_.end(),
            [&](Ref a, Ref b) { return m.name_of(a) < m.name_of(b); });
  // Without an index there is one shard, whose names the parser made unique; with one, the
  // checks above put every tensor in exactly one shard.
  return m;
}

const TensorInfo* Model::find(std::string_view name, const Header** shard) const {
  const auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                                   [&](Ref r, std::string_view n) { return name_of(r) < n; });
  if (it == by_name_.end() || name_of(*it) != name) return nullptr;
  if (shard) *shard = &shards_[it->shard];
  return &shards_[it->shard].tensors()[it->tensor];
}

std::uint64_t Model::tensor_bytes() const {
  std::uint64_t total = 0;
  for (const Header& h : shards_) total += h.data_size();
  return total;
}

}  // namespace thaw::safetensors

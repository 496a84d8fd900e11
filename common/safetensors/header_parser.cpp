#include "common/safetensors/header_parser.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/safetensors/strict_json.hpp"

namespace thaw::safetensors::core {

namespace {

using json = nlohmann::json;

// A tensor entry as the JSON states it, before the extents are checked.
struct RawTensor {
  std::string name;
  std::optional<Dtype> dtype;
  std::optional<std::vector<std::uint64_t>> shape;
  std::vector<std::uint64_t> offsets;  // data_offsets, relative to the data section
  bool has_offsets = false;
  std::uint64_t begin() const { return offsets[0]; }
  std::uint64_t end() const { return offsets[1]; }
};

std::string all_dtype_names() {
  std::string out;
  for (const Dtype d : kAllDtypes) {
    if (!out.empty()) out += ", ";
    out += dtype_name(d);
  }
  return out;
}

// Builds the tensor entries straight from nlohmann's SAX events: no DOM of untrusted input,
// and every error knows the tensor and field it is about. Returning false stops the parse.
class HeaderSax {
 public:
  explicit HeaderSax(std::string_view file) : file_(file) {}

  std::optional<Error> error;
  std::vector<RawTensor> tensors;
  std::map<std::string, std::string, std::less<>> metadata;
  bool complete() const { return state_ == State::done; }

  bool null() { return scalar(Scalar{.kind = Kind::null, .text = "null"}); }
  bool boolean(bool v) { return scalar(Scalar{.kind = Kind::other, .text = v ? "true" : "false"}); }
  bool number_integer(json::number_integer_t v) {
    // nlohmann reports only negative numbers (and -0) here; -0 is 0 to serde as well.
    if (v == 0) return number_unsigned(0);
    return scalar(Scalar{.kind = Kind::other, .text = fmt::format("the number {}", v)});
  }
  bool number_unsigned(json::number_unsigned_t v) {
    return scalar(Scalar{.kind = Kind::uint, .text = fmt::format("the number {}", v), .uint = v});
  }
  bool number_float(json::number_float_t, const std::string& text) {
    return scalar(Scalar{.kind = Kind::other, .text = fmt::format("the number {}", text)});
  }
  bool string(std::string& v) {
    return scalar(
        Scalar{.kind = Kind::string, .text = "the string " + quote_name(v), .string = &v});
  }
  bool binary(json::binary_t&) { return scalar(Scalar{.kind = Kind::other, .text = "binary"}); }

  bool start_object(std::size_t) { return open(/*object=*/true); }
  bool start_array(std::size_t) { return open(/*object=*/false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(std::string& k) {
    switch (state_) {
      case State::top:
        if (!top_keys_.insert(k).second) {
          return fail(errc::duplicate_key,
                      fmt::format("{}: key {} appears twice in the header", file_, quote_name(k)));
        }
        if (k == "__metadata__") {
          state_ = State::metadata_value;
        } else {
          current_ = RawTensor{.name = k};
          fields_.clear();
          state_ = State::entry_value;
        }
        return true;
      case State::tensor:
        if (!fields_.insert(k).second) {
          return fail(errc::duplicate_key,
                      fmt::format("{}field {} appears twice", tensor_prefix(), quote_name(k)));
        }
        field_ = k == "dtype"          ? Field::dtype
                 : k == "shape"        ? Field::shape
                 : k == "data_offsets" ? Field::data_offsets
                                       : Field::other;
        state_ = State::field_value;
        return true;
      case State::metadata:
        if (metadata.contains(k)) {
          return fail(errc::duplicate_key, fmt::format("{}: \"__metadata__\" key {} appears twice",
                                                       file_, quote_name(k)));
        }
        metadata_key_ = k;
        state_ = State::metadata_string;
        return true;
      case State::skip:
        return true;
      default:
        return fail(errc::invalid_json, fmt::format("{}: unexpected key {}", file_, quote_name(k)));
    }
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    if (!error) {
      error = Error{errc::invalid_json,
                    fmt::format("{}: header is not valid JSON: {}", file_, json_error_text(ex))};
    }
    return false;
  }

 private:
  enum class State {
    start,            // before the top-level value
    top,              // in the top-level object, between entries
    entry_value,      // after a tensor's name, before its entry
    metadata_value,   // after "__metadata__", before its value
    metadata,         // in "__metadata__", between entries
    metadata_string,  // after a metadata key, before its value
    tensor,           // in a tensor entry, between fields
    field_value,      // after a field name, before its value
    shape,            // in "shape"
    offsets,          // in "data_offsets"
    skip,             // in the array or object value of an ignored field
    done,             // after the top-level object
  };
  enum class Field { dtype, shape, data_offsets, other };
  enum class Kind { null, uint, string, other };
  struct Scalar {
    Kind kind;
    std::string text;  // for messages: "the number -3", "null", ...
    std::uint64_t uint = 0;
    const std::string* string = nullptr;
  };

  bool fail(errc code, std::string message) {
    if (!error) error = Error{code, std::move(message)};
    return false;
  }
  std::string tensor_prefix() const {
    return fmt::format("{}: tensor {}: ", file_, quote_name(current_.name));
  }
  static std::string_view field_name(Field f) {
    return f == Field::dtype ? "dtype" : f == Field::shape ? "shape" : "data_offsets";
  }

  bool scalar(const Scalar& v) {
    switch (state_) {
      case State::start:
        return fail(errc::invalid_json,
                    fmt::format("{}: header is {}, not a JSON object", file_, v.text));
      case State::entry_value:
        return fail(errc::invalid_entry,
                    fmt::format("{}entry is {}, not an object", tensor_prefix(), v.text));
      case State::metadata_value:
        if (v.kind == Kind::null) {  // the official parser reads it as no metadata
          state_ = State::top;
          return true;
        }
        return fail(
            errc::metadata_not_string,
            fmt::format("{}: \"__metadata__\" is {}, not an object of strings", file_, v.text));
      case State::metadata_string:
        if (v.kind != Kind::string) {
          return fail(errc::metadata_not_string,
                      fmt::format("{}: \"__metadata__\" key {} holds {}, not a string", file_,
                                  quote_name(metadata_key_), v.text));
        }
        metadata.emplace(std::move(metadata_key_), *v.string);
        state_ = State::metadata;
        return true;
      case State::field_value:
        state_ = State::tensor;
        switch (field_) {
          case Field::dtype:
            if (v.kind != Kind::string) {
              return fail(errc::invalid_entry,
                          fmt::format("{}\"dtype\" is {}, not a string", tensor_prefix(), v.text));
            }
            current_.dtype = parse_dtype(*v.string);
            if (!current_.dtype) {
              return fail(errc::unknown_dtype,
                          fmt::format("{}dtype {} is not a safetensors dtype ({})", tensor_prefix(),
                                      quote_name(*v.string), all_dtype_names()));
            }
            return true;
          case Field::shape:
          case Field::data_offsets:
            return fail(errc::invalid_entry,
                        fmt::format("{}\"{}\" is {}, not an array", tensor_prefix(),
                                    field_name(field_), v.text));
          case Field::other:  // ignored, as serde ignores unknown fields
            return true;
        }
        return true;
      case State::shape:
        if (v.kind != Kind::uint) {
          return fail(errc::invalid_entry,
                      fmt::format("{}\"shape\" holds {}, not a non-negative integer",
                                  tensor_prefix(), v.text));
        }
        current_.shape->push_back(v.uint);
        return true;
      case State::offsets:
        if (v.kind != Kind::uint) {
          return fail(errc::invalid_entry,
                      fmt::format("{}\"data_offsets\" holds {}, not a non-negative integer",
                                  tensor_prefix(), v.text));
        }
        if (current_.offsets.size() == 2) {
          return fail(errc::invalid_entry,
                      fmt::format("{}\"data_offsets\" has more than 2 values (begin, end)",
                                  tensor_prefix()));
        }
        current_.offsets.push_back(v.uint);
        return true;
      case State::skip:
        return true;
      default:  // the JSON parser never gives a value where a key belongs
        return fail(errc::invalid_json, fmt::format("{}: unexpected {}", file_, v.text));
    }
  }

  bool open(bool object) {
    if (++depth_ > kMaxJsonDepth) {
      return fail(errc::invalid_json,
                  fmt::format("{}: header nested deeper than {} levels", file_, kMaxJsonDepth));
    }
    const std::string_view what = object ? "an object" : "an array";
    switch (state_) {
      case State::start:
        if (!object)
          return fail(errc::invalid_json, fmt::format("{}: header is an array, not a "
                                                      "JSON object",
                                                      file_));
        state_ = State::top;
        return true;
      case State::entry_value:
        if (!object) {
          return fail(errc::invalid_entry,
                      fmt::format("{}entry is an array, not an object", tensor_prefix()));
        }
        state_ = State::tensor;
        return true;
      case State::metadata_value:
        if (!object) {
          return fail(
              errc::metadata_not_string,
              fmt::format("{}: \"__metadata__\" is an array, not an object of strings", file_));
        }
        state_ = State::metadata;
        return true;
      case State::metadata_string:
        return fail(errc::metadata_not_string,
                    fmt::format("{}: \"__metadata__\" key {} holds {}, not a string", file_,
                                quote_name(metadata_key_), what));
      case State::field_value:
        switch (field_) {
          case Field::dtype:
            return fail(errc::invalid_entry,
                        fmt::format("{}\"dtype\" is {}, not a string", tensor_prefix(), what));
          case Field::shape:
          case Field::data_offsets:
            if (object) {
              return fail(errc::invalid_entry, fmt::format("{}\"{}\" is an object, not an array",
                                                           tensor_prefix(), field_name(field_)));
            }
            if (field_ == Field::shape) {
              current_.shape.emplace();
              state_ = State::shape;
            } else {
              current_.has_offsets = true;
              state_ = State::offsets;
            }
            return true;
          case Field::other:
            skip_depth_ = 1;
            state_ = State::skip;
            return true;
        }
        return true;
      case State::shape:
      case State::offsets:
        return fail(errc::invalid_entry,
                    fmt::format("{}\"{}\" holds {}, not a non-negative integer", tensor_prefix(),
                                state_ == State::shape ? "shape" : "data_offsets", what));
      case State::skip:
        ++skip_depth_;
        return true;
      default:
        return fail(errc::invalid_json, fmt::format("{}: unexpected {}", file_, what));
    }
  }

  bool close() {
    --depth_;
    switch (state_) {
      case State::top:
        state_ = State::done;
        return true;
      case State::metadata:
        state_ = State::top;
        return true;
      case State::tensor:
        for (const Field f : {Field::dtype, Field::shape, Field::data_offsets}) {
          const bool present = f == Field::dtype   ? current_.dtype.has_value()
                               : f == Field::shape ? current_.shape.has_value()
                                                   : current_.has_offsets;
          if (!present) {
            return fail(errc::invalid_entry,
                        fmt::format("{}no \"{}\" field", tensor_prefix(), field_name(f)));
          }
        }
        tensors.push_back(std::move(current_));
        current_ = RawTensor{};
        state_ = State::top;
        return true;
      case State::shape:
        state_ = State::tensor;
        return true;
      case State::offsets:
        if (current_.offsets.size() != 2) {
          return fail(
              errc::invalid_entry,
              fmt::format("{}\"data_offsets\" has {} value{}, not 2 (begin, end)", tensor_prefix(),
                          current_.offsets.size(), current_.offsets.size() == 1 ? "" : "s"));
        }
        state_ = State::tensor;
        return true;
      case State::skip:
        if (--skip_depth_ == 0) state_ = State::tensor;
        return true;
      default:
        return fail(errc::invalid_json, fmt::format("{}: unexpected end of a container", file_));
    }
  }

  std::string_view file_;
  State state_ = State::start;
  int depth_ = 0;
  int skip_depth_ = 0;
  Field field_ = Field::other;
  RawTensor current_;
  std::set<std::string, std::less<>> fields_;  // fields of current_ seen so far
  std::unordered_set<std::string> top_keys_;
  std::string metadata_key_;
};

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The tiling and size rules of Metadata::validate, in its order: tensors sorted by
// (begin, end); per tensor, offsets first, then size; then the end of the file.
std::optional<Error> check_extents(std::string_view file, std::uint64_t header_size,
                                   std::uint64_t data_size, const std::vector<RawTensor>& tensors,
                                   std::vector<std::size_t>& order) {
  order.resize(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const RawTensor& x = tensors[a];
    const RawTensor& y = tensors[b];
    return std::tie(x.offsets[0], x.offsets[1], x.name) <
           std::tie(y.offsets[0], y.offsets[1], y.name);
  });

  std::uint64_t start = 0;            // where the next tensor must begin
  const RawTensor* holder = nullptr;  // the last tensor with bytes: it ends at `start`
  for (const std::size_t i : order) {
    const RawTensor& t = tensors[i];
    const std::string where = fmt::format("{}: tensor {}: data_offsets [{}, {})", file,
                                          quote_name(t.name), t.begin(), t.end());
    if (t.end() < t.begin()) {
      return Error{errc::offsets_reversed, where + " end before they begin"};
    }
    if (t.begin() > start) {
      return Error{
          errc::offsets_gap,
          holder ? fmt::format("{} start at {} but tensor {} ends at {}: bytes [{}, {}) "
                               "of the data section belong to no tensor",
                               where, t.begin(), quote_name(holder->name), start, start, t.begin())
                 : fmt::format("{}: the data section starts at 0, so its bytes [0, {}) "
                               "belong to no tensor",
                               where, t.begin())};
    }
    if (t.begin() < start) {
      return Error{errc::offsets_overlap,
                   fmt::format("{} overlap tensor {} at [{}, {})", where, quote_name(holder->name),
                               holder->begin(), holder->end())};
    }

    std::uint64_t elements = 1;
    bool overflow = false;
    for (const std::uint64_t d : *t.shape)
      overflow |= __builtin_mul_overflow(elements, d, &elements);
    std::uint64_t bits = 0;
    overflow |= __builtin_mul_overflow(elements, std::uint64_t{dtype_bits(*t.dtype)}, &bits);
    if (overflow) {
      return Error{errc::shape_overflow,
                   fmt::format("{}: tensor {}: shape {} of {} needs more than 2^64 bits", file,
                               quote_name(t.name), shape_text(*t.shape), dtype_name(*t.dtype))};
    }
    if (bits % 8 != 0) {
      return Error{
          errc::misaligned_size,
          fmt::format("{}: tensor {}: shape {} of {} is {} bits, not a whole number of "
                      "bytes",
                      file, quote_name(t.name), shape_text(*t.shape), dtype_name(*t.dtype), bits)};
    }
    if (bits / 8 != t.end() - t.begin()) {
      return Error{
          errc::size_mismatch,
          fmt::format("{} hold {} bytes but shape {} of {} needs {}", where, t.end() - t.begin(),
                      shape_text(*t.shape), dtype_name(*t.dtype), bits / 8)};
    }
    if (t.end() > data_size) {
      return Error{errc::out_of_bounds,
                   fmt::format("{} end past the data section, which holds {} bytes (file size "
                               "{} = 8 + header {} + {})",
                               where, data_size, data_size + kLengthPrefixBytes + header_size,
                               header_size, data_size)};
    }
    start = t.end();
    if (t.end() > t.begin()) holder = &t;
  }
  if (start < data_size) {
    return Error{errc::trailing_bytes,
                 fmt::format("{}: the tensors end at byte {} of the data section but the file "
                             "holds {} data bytes: {} trailing bytes after the last tensor",
                             file, start, data_size, data_size - start)};
  }
  return std::nullopt;
}

}  // namespace

std::optional<Error> read_header_length(std::span<const std::byte> first_bytes,
                                        std::uint64_t file_size, std::string_view file,
                                        std::uint64_t& header_size) {
  if (file_size < kLengthPrefixBytes) {
    return Error{errc::truncated,
                 fmt::format("{}: the file holds {} bytes, fewer than the 8-byte header length",
                             file, file_size)};
  }
  if (first_bytes.size() < kLengthPrefixBytes) {
    return Error{errc::truncated,
                 fmt::format("{}: {} bytes given, the header length needs the first 8", file,
                             first_bytes.size())};
  }
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < kLengthPrefixBytes; ++i) {
    n |= std::uint64_t{std::to_integer<std::uint8_t>(first_bytes[i])} << (8 * i);
  }
  if (n > kMaxHeaderBytes) {
    return Error{errc::header_too_large,
                 fmt::format("{}: header length {} exceeds the limit of {} bytes", file, n,
                             kMaxHeaderBytes)};
  }
  if (n > file_size - kLengthPrefixBytes) {
    return Error{errc::truncated,
                 fmt::format("{}: header length {} needs {} bytes but the file holds {}", file, n,
                             kLengthPrefixBytes + n, file_size)};
  }
  header_size = n;
  return std::nullopt;
}

std::optional<Error> parse_header(std::span<const std::byte> prefix, std::uint64_t file_size,
                                  std::string_view file, Header& out) {
  std::uint64_t n = 0;
  if (auto e = read_header_length(prefix, file_size, file, n)) return e;
  if (prefix.size() - kLengthPrefixBytes < n) {
    return Error{errc::truncated, fmt::format("{}: {} bytes given, the header needs the first {}",
                                              file, prefix.size(), kLengthPrefixBytes + n)};
  }
  const std::string_view text(reinterpret_cast<const char*>(prefix.data()) + kLengthPrefixBytes,
                              static_cast<std::size_t>(n));
  if (auto e = check_json_text(text, fmt::format("{}: header", file))) return e;

  HeaderSax sax(file);
  const bool ok = json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (sax.error) return sax.error;
  if (!ok || !sax.complete()) {
    return Error{errc::invalid_json, fmt::format("{}: header is not a complete JSON object", file)};
  }

  const std::uint64_t data_size = file_size - kLengthPrefixBytes - n;
  std::vector<std::size_t> order;
  if (auto e = check_extents(file, n, data_size, sax.tensors, order)) return e;

  std::vector<TensorInfo> tensors;
  tensors.reserve(order.size());
  const std::uint64_t base = kLengthPrefixBytes + n;
  for (const std::size_t i : order) {
    RawTensor& t = sax.tensors[i];
    tensors.push_back(TensorInfo{.name = std::move(t.name),
                                 .dtype = *t.dtype,
                                 .shape = std::move(*t.shape),
                                 .begin = base + t.begin(),
                                 .end = base + t.end()});
  }
  out = Header(std::string(file), n, file_size, std::move(tensors), std::move(sax.metadata));
  return std::nullopt;
}

}  // namespace thaw::safetensors::core

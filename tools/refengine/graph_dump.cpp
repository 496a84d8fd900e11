#include "graph_dump.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

namespace refengine {

namespace {
// The emulator's declaration (emu_inspect.h); the engine includes no thaw header, so it is
// repeated here. CUgraphExec is cuda.h's `struct CUgraphExec_st*`, as the header declares.
using DescribeGraphExec = int (*)(CUgraphExec, char**);
}  // namespace

std::expected<void, std::string> dump_graphs(const Driver& driver,
                                             const std::map<int, CUgraphExec>& graphs,
                                             const std::filesystem::path& file) {
  auto describe = reinterpret_cast<DescribeGraphExec>(driver.extension("thawEmuDescribeGraphExec"));
  if (describe == nullptr)
    return std::unexpected(fmt::format(
        "--dump-graphs needs thaw's CUDA driver emulator (its thawEmuDescribeGraphExec call): "
        "the driver {} has none, and the CUDA driver API cannot list an executable graph's "
        "nodes",
        driver.source()));
  nlohmann::json doc = nlohmann::json::object();
  for (const auto& [size, exec] : graphs) {
    char* text = nullptr;
    if (int r = describe(exec, &text); r != CUDA_SUCCESS)
      return std::unexpected(driver.error_message(
          static_cast<CUresult>(r),
          fmt::format("--dump-graphs: describing the graph of batch size {}", size)));
    std::unique_ptr<char, decltype(&std::free)> owned(text, &std::free);
    auto parsed = nlohmann::json::parse(text, nullptr, false);
    if (parsed.is_discarded())
      return std::unexpected(fmt::format(
          "--dump-graphs: the emulator's description of batch size {} is not JSON", size));
    doc[std::to_string(size)] = std::move(parsed);
  }
  std::ofstream out(file, std::ios::trunc);
  out << doc.dump() << "\n";
  out.close();
  if (!out) return std::unexpected(fmt::format("--dump-graphs {}: write failed", file.string()));
  return {};
}

}  // namespace refengine

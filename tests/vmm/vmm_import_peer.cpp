// A second process, as an engine under the shim would be: imports the page descriptors a
// GpuMemory exported (inherited fds), maps them at the exporter's own slot addresses, and
// checks that every piece of the layout holds exactly the file bytes it names.
//
// usage: vmm_import_peer MODEL_DIR LAYOUT_FILE BASE PAGE_BYTES FD:SLOT_OFFSET...
//   LAYOUT_FILE: lines "slot_offset file file_offset bytes"
// Exit 0 and "verified N pieces" when all match; 1 with a message otherwise.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/cuda/driver.hpp"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "vmm_import_peer: %s\n", message.c_str());
  return 1;
}

std::vector<char> read_range(const std::string& path, std::uint64_t offset, std::uint64_t n) {
  std::vector<char> out(n);
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out.data(), static_cast<std::streamsize>(n));
  if (!in) out.clear();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) return fail("usage: MODEL_DIR LAYOUT_FILE BASE PAGE_BYTES FD:OFFSET...");
  const std::string model_dir = argv[1];
  const CUdeviceptr base = std::strtoull(argv[3], nullptr, 0);
  const std::size_t page = std::strtoull(argv[4], nullptr, 0);
  std::vector<std::pair<int, std::uint64_t>> pages;
  std::uint64_t span = 0;
  for (int i = 5; i < argc; ++i) {
    std::string arg = argv[i];
    const auto colon = arg.find(':');
    const int fd = std::atoi(arg.substr(0, colon).c_str());
    const std::uint64_t offset = std::strtoull(arg.substr(colon + 1).c_str(), nullptr, 0);
    pages.emplace_back(fd, offset);
    span = std::max<std::uint64_t>(span, offset + page);
  }

  auto loaded = thaw::cuda::Driver::load();
  if (!loaded) return fail(loaded.error().what());
  const thaw::cuda::Driver& d = **loaded;
  if (auto ok = d.init(); !ok) return fail(ok.error().what());
  auto dev = d.device_get(0);
  if (!dev) return fail(dev.error().what());
  auto ctx = d.primary_ctx_retain(*dev);
  if (!ctx || !d.ctx_set_current(*ctx)) return fail("no context");
  // The exporter's own addresses: the reservation must land exactly at `base`.
  auto va = d.address_reserve(span, page, base);
  if (!va) return fail(va.error().what());
  if (*va != base) return fail("could not reserve the exporter's addresses");
  for (const auto& [fd, offset] : pages) {
    auto handle = d.import_from_fd(fd);
    if (!handle) return fail(handle.error().what());
    if (auto ok = d.mem_map(base + offset, page, 0, *handle); !ok) return fail(ok.error().what());
    if (auto ok = d.mem_set_access(base + offset, page, *dev); !ok) return fail(ok.error().what());
    (void)d.mem_release(*handle);  // the mapping keeps the memory
  }

  std::ifstream layout(argv[2]);
  std::string line;
  int pieces = 0;
  while (std::getline(layout, line)) {
    std::istringstream in(line);
    std::uint64_t slot_offset = 0, file_offset = 0, bytes = 0;
    std::string file;
    if (!(in >> slot_offset >> file >> file_offset >> bytes)) continue;
    auto expected = read_range(model_dir + "/" + file, file_offset, bytes);
    if (expected.size() != bytes) return fail("cannot read " + file);
    std::vector<char> actual(bytes);
    if (auto ok = d.memcpy_dtoh(actual.data(), base + slot_offset, bytes); !ok) {
      return fail(ok.error().what());
    }
    if (actual != expected) {
      return fail("slot offset " + std::to_string(slot_offset) + " does not hold " + file +
                  " bytes " + std::to_string(file_offset) + "+" + std::to_string(bytes));
    }
    ++pieces;
  }
  for (const auto& [fd, offset] : pages) (void)d.mem_unmap(base + offset, page);
  (void)d.address_free(base, span);
  (void)d.primary_ctx_release(*dev);
  std::printf("verified %d pieces\n", pieces);
  return pieces > 0 ? 0 : fail("the layout file lists no pieces");
}

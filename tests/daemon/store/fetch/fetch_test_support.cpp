#include "fetch_test_support.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>

#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/fetch/manifest_publish.hpp"

namespace thaw::store::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

int run_program(const std::vector<std::string>& argv, std::string* out, std::string* err) {
  // Files, not pipes: reading two pipes one after the other could deadlock on a full one.
  TempDir dir;
  const fs::path out_path = dir.path() / "stdout";
  const fs::path err_path = dir.path() / "stderr";
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const auto slurp = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  if (out != nullptr) *out = slurp(out_path);
  if (err != nullptr) *err = slurp(err_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void generate_model(const fs::path& dir) {
  const int rc = run_program({THAW_GENMODEL_PATH, "--size", "custom", "--layers", "8", "--embd",
                              "256", "--heads", "4", "--vocab", "1000", "--shard-size", "2MB",
                              "--quiet", "--out", dir.string()});
  if (rc != 0) throw std::runtime_error(fmt::format("thaw-genmodel exited with {}", rc));
}

std::vector<std::byte> read_file(const fs::path& path) {
  return read_range(path, 0, fs::file_size(path));
}

std::vector<std::byte> read_range(const fs::path& path, std::uint64_t offset,
                                  std::uint64_t length) {
  std::vector<std::byte> out(length);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  std::uint64_t done = 0;
  while (done < length) {
    const ssize_t n =
        ::pread(fd, out.data() + done, length - done, static_cast<off_t>(offset + done));
    if (n <= 0) break;
    done += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  if (done != length) throw std::runtime_error("short read of " + path.string());
  return out;
}

std::vector<std::string> model_files(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name != kManifestName) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

ChunkSet planned_chunks(const safetensors::FileFetch& file, std::uint64_t chunk_size) {
  ChunkSet set(file.size, chunk_size);
  for (const auto& range : file.ranges) set.add_bytes(range.begin, range.end);
  return set;
}

ChunkSet verified_chunks(const ChunkReadiness& readiness) {
  ChunkSet set(readiness.file_size(), readiness.chunk_size());
  for (std::uint64_t c = 0; c < readiness.chunk_count(); ++c) {
    if (readiness.chunk_verified(c)) set.add(c);
  }
  return set;
}

RegistryFixture::RegistryFixture(std::string limit_rate) {
  generate_model(model_dir());
  PublishOptions options;
  options.chunk_size = kTestChunkBytes;
  if (auto ok = publish_manifest(model_dir(), options); !ok) {
    throw std::runtime_error(ok.error().message);
  }
  std::string extra;
  if (!limit_rate.empty()) {
    extra = fmt::format("location /slow/ {{ alias {}/; limit_rate {}; }}",
                        registry_.path().string(), limit_rate);
  }
  server_ = std::make_unique<NginxServer>(NginxOptions{registry_.path(), extra});
}

std::unique_ptr<Registry> RegistryFixture::registry(const std::string& prefix) const {
  auto registry = open_registry(server_->base_url() + prefix);
  if (!registry) throw std::runtime_error(registry.error().message);
  return std::move(*registry);
}

HostCache RegistryFixture::open_cache(std::uint64_t budget) const {
  return open_cache_at(cache_.path(), budget);
}

HostCache RegistryFixture::open_cache_at(const fs::path& root, std::uint64_t budget) const {
  auto cache = HostCache::open(HostCacheConfig{root, budget, {}, {}});
  if (!cache) throw std::runtime_error(cache.error().message);
  return std::move(*cache);
}

fs::path RegistryFixture::cached_path(const std::string& file) const {
  return cache_layout::data_path(cache_.path(), kModelName, file);
}

FetcherConfig RegistryFixture::fast_retry_config() {
  FetcherConfig config;
  config.backoff_initial = 20ms;
  config.backoff_max = 200ms;
  config.max_retries = 50;
  config.jitter_seed = 7;
  return config;
}

}  // namespace thaw::store::testing

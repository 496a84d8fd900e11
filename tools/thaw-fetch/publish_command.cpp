// `thaw-fetch publish DIR`: writes DIR/thaw-manifest.json for the model in DIR.
#include <fmt/format.h>

#include "byte_size.hpp"
#include "commands.hpp"
#include "daemon/store/fetch/manifest_publish.hpp"
#include "report.hpp"

namespace thaw::fetch_cli {

int run_publish(const PublishArgs& args) {
  store::PublishOptions options;
  options.chunk_size = args.chunk_size;
  options.chain = !args.plain_chunk_digests;
  if (!args.quiet && !args.json) {
    options.on_file = [](const std::string& path, std::uint64_t size) {
      fmt::print(stderr, "  {} ({})\n", path, format_bytes(static_cast<double>(size)));
    };
  }
  auto manifest = store::publish_manifest(args.dir, options);
  if (!manifest) return report_error("publish: " + manifest.error().message);
  const std::string path = (std::filesystem::path(args.dir) / store::kManifestName).string();
  const auto summary = publish_summary(path, *manifest, args.chunk_size);
  if (args.json) {
    fmt::print("{}\n", summary.dump());
  } else if (!args.quiet) {
    fmt::print("{}: {} files, {}, chunks of {}\n", path, manifest->files.size(),
               format_bytes(summary["bytes"].get<double>()),
               format_bytes(static_cast<double>(args.chunk_size)));
  }
  return 0;
}

}  // namespace thaw::fetch_cli

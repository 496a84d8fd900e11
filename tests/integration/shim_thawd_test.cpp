// The shim with thawd (tests/integration: daemon + shim + emulator + private dbus-daemon +
// loopback nginx): the reference engine, unmodified, loads a model thawd is still fetching,
// taking each file's readiness map from thawd over the shim socket, and gets the same tokens
// as from the finished model; thawd killed mid-load makes the engine fail, never produce
// tokens from bytes that did not arrive.
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "engine_process.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

std::vector<std::string> engine_args(const fs::path& model) {
  return refengine_test::small_generate_args(
      model, {"--num-gpu-blocks-override", "32", "--enforce-eager"});
}

std::vector<nlohmann::json> tokens_of(const refengine_test::EngineRun& r) {
  std::vector<nlohmann::json> out;
  for (const auto& line : refengine_test::json_lines(r.out)) out.push_back(line["tokens"]);
  return out;
}

class ShimWithThawd : public ThawdFixture {
 protected:
  // Fetch through thawd; returns once the model's files exist in its cache.
  void fetch_in_background() {
    ASSERT_EQ(thawctl({"fetch", "--no-wait", "gpt-syn"}).exit_code, 0) << log();
    const auto files = thaw::store::testing::model_files(registry_->model_dir());
    ASSERT_TRUE(thaw::testing::eventually([&] {
      for (const auto& f : files) {
        if (!fs::exists(dir_.path() / "cache" / "gpt-syn" / f)) return false;
      }
      return true;
    }));
  }
  std::string shim_env(const std::string& extra = "") const {
    return "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
           " THAW_PRELOAD_LOG=" + (dir_.path() / "shim.log").string() + " " + extra;
  }
};

TEST_F(ShimWithThawd, EngineStreamsAModelThawdIsFetching) {
  start_registry();
  start_thawd(BusPolicy::open, "6MB");
  const auto reference = refengine_test::run_engine(engine_args(registry_->model_dir()));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  fetch_in_background();
  const auto streamed =
      refengine_test::run_engine(engine_args(dir_.path() / "cache" / "gpt-syn"), shim_env());
  ASSERT_EQ(streamed.exit_code, 0)
      << streamed.err << thaw::testing::slurp(dir_.path() / "shim.log");
  EXPECT_EQ(tokens_of(streamed), tokens_of(reference));
  const std::string shim_log = thaw::testing::slurp(dir_.path() / "shim.log");
  EXPECT_NE(shim_log.find("connected to thawd"), std::string::npos) << shim_log;
  EXPECT_NE(shim_log.find("readiness from thawd"), std::string::npos) << shim_log;
  EXPECT_NE(log().find("engine refengine"), std::string::npos) << log();
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(ShimWithThawd, ThawdKilledMidLoadNeverYieldsTokensFromMissingBytes) {
  start_registry();
  start_thawd(BusPolicy::open, "2MB");
  const auto reference = refengine_test::run_engine(engine_args(registry_->model_dir()));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  fetch_in_background();
  std::thread killer([&] {
    std::this_thread::sleep_for(1500ms);
    kill_thawd();
  });
  const auto streamed = refengine_test::run_engine(engine_args(dir_.path() / "cache" / "gpt-syn"),
                                                   shim_env("THAW_PRELOAD_READ_TIMEOUT=3"));
  killer.join();
  if (streamed.exit_code == 0) {
    EXPECT_EQ(tokens_of(streamed), tokens_of(reference)) << "finished on wrong bytes";
  } else {
    EXPECT_TRUE(streamed.err.find("Input/output error") != std::string::npos ||
                streamed.exit_code == 128 + SIGBUS ||
                streamed.err.find("AddressSanitizer: BUS") != std::string::npos)
        << "exit " << streamed.exit_code << ": " << streamed.err;
  }
}

}  // namespace

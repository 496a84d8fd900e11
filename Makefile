# The two commands of the quick start. Each does its own set-up: missing Debian
# packages, configure, build; then runs.
PRESET ?= default
CMAKE  ?= cmake
CTEST  ?= ctest
# THAW_CCACHE=1 (or 0): compile through ccache (CMakeLists.txt says when that pays); passed to
# every configure here, so it also switches a build directory configured before.
CONFIGURE_ARGS := $(if $(THAW_CCACHE),-DTHAW_CCACHE=$(THAW_CCACHE))

.PHONY: all deps build demo demo-cluster gpu-kit deb test test-default test-asan test-fuzz test-packaging format clean

all: build

deps:
	@scripts/install-deps

build: deps
	$(CMAKE) --preset $(PRESET) $(CONFIGURE_ARGS) >/dev/null
	$(CMAKE) --build --preset $(PRESET)

# Runs thaw's main job on the built-in CUDA driver emulator (tools/demo/run-demo.sh): a
# private thawd, dbus-daemon and nginx registry, the reference engine started four ways
# (cold, streamed, prewarmed copy, prewarmed zero-copy); prints a table and writes a
# timeline picture. No root needed. DEMO_ARGS=--quick: a smaller model.
DEMO_ARGS ?=
demo: build
	@tools/demo/run-demo.sh --build build/$(PRESET) $(DEMO_ARGS)

# The cluster in a box (tools/demo-cluster/run-demo-cluster.sh; root: network namespaces, tc):
# 4 thawd nodes on emulated GPUs behind 1 Gbit/s shaped links, nginx registry, coordinator and
# gateway; a slice of an Azure LLM trace replayed on 3 models with thaw, then on the baseline
# (whole download, then start). Writes build/$(PRESET)/demo-cluster/summary.md, summary.json and
# timeline.svg. DEMO_CLUSTER_ARGS: e.g. --quick, --nodes 2, --rate 250mbit, --count 48.
DEMO_CLUSTER_ARGS ?=
demo-cluster: build
	@tools/demo-cluster/run-demo-cluster.sh --build build/$(PRESET) $(DEMO_CLUSTER_ARGS)

# The real-GPU kit (issue 21): a release build of thaw, the emulator and the checks, in
# build/gpu-kit/ (<= 48 MiB). Run it anywhere with build/gpu-kit/run --out DIR [--quick];
# docs/GPU-VALIDATION.md says what it checks.
gpu-kit: deps
	$(CMAKE) --preset release $(CONFIGURE_ARGS) >/dev/null
	$(CMAKE) --build --preset release --target gpu-kit

# The Debian packages (issue 23; debian/): thaw, thaw-coordinator, thaw-emulator, thaw-dev in
# build/deb/, from a copy of the tree, checked with lintian --pedantic. A release build of
# the shipped targets on a Debian 12 machine (about 15 min on 2 cores); no tests are run.
deb: deps
	@scripts/build-deb

# Every test, in the default build and under ASan+UBSan, then a bounded libFuzzer run, then
# the Debian packages under a booted systemd.
test: deps
	$(MAKE) --no-print-directory test-default test-asan test-fuzz test-packaging

test-default:
	$(CMAKE) --preset default $(CONFIGURE_ARGS) >/dev/null
	$(CMAKE) --build --preset default
	$(CTEST) --preset default

test-asan:
	$(CMAKE) --preset asan $(CONFIGURE_ARGS) >/dev/null
	$(CMAKE) --build --preset asan
	$(CTEST) --preset asan

# libFuzzer on the module image parsers (clang build in build/fuzz), fixed seed and time
# so CI is reproducible. Longer runs: tests/fuzz/run-libfuzzer.sh 600
FUZZ_SECONDS ?= 30
test-fuzz:
	tests/fuzz/run-libfuzzer.sh $(FUZZ_SECONDS) -seed=1

# The packages (make deb, reusing build/deb's build directory when there is one) installed,
# used and purged in a Debian 12 root booted with systemd as PID 1
# (tests/packaging/package_boot_test.sh; the reference engine comes from build/default).
# Where the machine cannot boot such a container (not root, no cgroups...) it says why and
# passes as skipped.
test-packaging:
	@rc=0; tests/packaging/booted_root.sh prepare || rc=$$?; \
	if [ $$rc -eq 0 ]; then scripts/build-deb --keep || rc=$$?; fi; \
	if [ $$rc -eq 0 ]; then tests/packaging/package_boot_test.sh --debs build/deb --build build/default || rc=$$?; fi; \
	if [ $$rc -eq 77 ]; then echo "test-packaging: skipped (reason above)"; rc=0; fi; exit $$rc

format:
	git ls-files '*.cpp' '*.hpp' '*.h' '*.c' | grep -v '^third_party/' | xargs clang-format -i

clean:
	rm -rf build

# The two commands a new user needs (see README.md):
#   make run    build, then run the main job (a local 4-rank run)
#   make test   build, then run every test
# Both install missing Debian packages first (as root) and configure meson on first use.
# CI (.ci/run) runs `make test`, then the suite under ASan+UBSan and the threaded tests under TSan.

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc)
# GCC 12 reports false "may be used uninitialized" inside libstdc++ (std::regex, std::function)
# once sanitizers change inlining; the release build keeps the warning as an error.
# ThreadSanitizer cannot model std::atomic_thread_fence (-Wtsan): the shared-memory doorbell's
# fences order memory between processes, which TSan does not observe anyway.
MESON_TEST  = meson test --num-processes $(JOBS) --print-errorlogs
# The sanitizer builds compile at -O1 with line tables only (-g1): the sanitizers' reports still
# name file and line, and the build takes less than half the time of -O2 -g (147 s against 64 s
# for the largest file under ASan+UBSan on this 2-core VM), which is most of CI's time.
SANITIZER_OPT = --buildtype=debugoptimized -Doptimization=1 -Db_ndebug=false

.PHONY: all deps build run test test-asan test-tsan fuzz check format format-check clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/build.ninja: | deps
	meson setup $(BUILD) --buildtype=release

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD) -j $(JOBS)

run: build
	scripts/run-main-job $(BUILD)

test: build
	@$(MESON_TEST) -C $(BUILD) --suite all; status=$$?; \
	  scripts/test-summary $(BUILD); exit $$status

$(ASAN_BUILD)/build.ninja: | deps
	meson setup $(ASAN_BUILD) $(SANITIZER_OPT) -Db_sanitize=address,undefined \
	  -Db_lundef=false -Dc_args="['-g1']" -Dcpp_args="['-g1','-Wno-maybe-uninitialized']"

test-asan: deps $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD) -j $(JOBS)
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  $(MESON_TEST) -C $(ASAN_BUILD) --suite all --timeout-multiplier 4; status=$$?; \
	  scripts/test-summary $(ASAN_BUILD); exit $$status

$(TSAN_BUILD)/build.ninja: | deps
	meson setup $(TSAN_BUILD) $(SANITIZER_OPT) -Db_sanitize=thread -Db_lundef=false \
	  -Dc_args="['-g1']" -Dcpp_args="['-g1','-Wno-maybe-uninitialized','-Wno-tsan']"

# No ninja step of its own: `meson test --suite threaded` builds what those tests need and no
# more (not the benchmarks and tools), 5m45 of TSan compiling here instead of the whole tree.
test-tsan: deps $(TSAN_BUILD)/build.ninja
	@TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/support/tsan.supp \
	  $(MESON_TEST) -C $(TSAN_BUILD) --suite threaded --timeout-multiplier 4; status=$$?; \
	  scripts/test-summary $(TSAN_BUILD); exit $$status

# libFuzzer on the store server's parser and connection state machine, 60 s each (scripts/fuzz-store).
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/install-deps --fuzz
	scripts/fuzz-store $(FUZZ_SECONDS)

check: test test-asan test-tsan fuzz

format:
	git ls-files '*.h' '*.cc' '*.c' | xargs clang-format -i

# Fails, listing them, when tracked sources differ from what clang-format (.clang-format) makes.
format-check:
	@scripts/install-deps --format
	@bad=$$(git ls-files '*.h' '*.cc' '*.c' | while read -r f; do \
	  clang-format --dry-run --Werror "$$f" >/dev/null 2>&1 || echo "$$f"; done); \
	if [ -n "$$bad" ]; then echo "not clang-formatted (run make format):"; echo "$$bad"; exit 1; fi; \
	echo "clang-format: every source file is formatted"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)

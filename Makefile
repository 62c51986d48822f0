# optstate: `make run` starts the daemon, `make test` runs the test suite.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
LISTEN ?= 127.0.0.1:50051
ARGS ?=
# Extra CMake options (-DNAME=VALUE ...), for every configure (the images'
# too: Dockerfile, Dockerfile.cuda).
CMAKE_ARGS ?=
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: deps test-deps torch-deps emulator-deps python container-deps configure build run test \
  sanitize fuzz \
  bench bench-deepspeed demo gpu-test install-daemon package container-test clean

deps:
	@bash scripts/install-deps.sh

# What only the tests need beyond deps: a Prometheus server (tests/python/
# test_metrics.py scrapes the daemon with it).
test-deps: deps
	@bash scripts/install-deps.sh test

# torch, for the test that holds the AdamW step against torch.optim.AdamW.
torch-deps: deps
	@bash scripts/install-torch.sh

# The Bochs CPU emulator's Python binding, for the test that runs the kernel's
# AVX-512 machine code on CPUs without AVX-512 (tests/emulated).
emulator-deps: torch-deps
	@bash scripts/install-emulator.sh

# The optstate Python package (client/python), built and installed into the
# test venv (.torch-venv) with its build tools and pytest.
python: deps
	@JOBS=$(JOBS) bash scripts/install-python.sh

# Docker's engine, docker-compose and debootstrap, for make container-test.
container-deps:
	@bash scripts/install-deps.sh containers

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS) \
	  > $(BUILD_DIR).configure.log 2>&1 || (cat $(BUILD_DIR).configure.log; exit 1)

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Builds only the daemon, then starts it in the foreground with defaults that
# work without a GPU.
run: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target optstated
	$(BUILD_DIR)/server/optstated --listen=$(LISTEN) $(ARGS)

# The daemon and optstate-probe (cmake --install's component daemon) and the
# example trainer (component examples), built with the configure above and
# installed under $(DESTDIR)$(PREFIX): what the images do (Dockerfile,
# Dockerfile.cuda), so they build as make builds.
install-daemon: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target optstated optstate-probe train_linear_regression
	@DESTDIR=$(DESTDIR) cmake --install $(BUILD_DIR) --prefix $(PREFIX) --component daemon
	@DESTDIR=$(DESTDIR) cmake --install $(BUILD_DIR) --prefix $(PREFIX) --component examples

# The Debian packages (cmake/package.cmake): $(BUILD_DIR)/optstated_*.deb
# (the daemon and optstate-probe) and $(BUILD_DIR)/liboptstate-dev_*.deb (the
# client library, headers, CMake and pkg-config files).
package: build
	@cd $(BUILD_DIR) && cpack -G DEB > cpack.log 2>&1 || (cat cpack.log; exit 1)
	@ls $(BUILD_DIR)/*.deb

# The deployment run for real (tests/container/run.sh says each step): the
# .deb installed into a clean debian:12 image, where the daemon starts and a
# program built against the client steps; the image built; the Kubernetes
# pod's container run as its manifest says; docker-compose up with the
# trainer; optstated killed with SIGKILL and, once more, restarted with
# SIGTERM mid-run, the trainer finishing with the parameters of an
# uninterrupted run. Starts (and stops) its own Docker engine when none runs;
# fails when it cannot.
container-test: container-deps package
	@bash tests/container/run.sh $(BUILD_DIR)

# Every test that needs no GPU (tests labelled gpu run via tests/gpu/run.sh),
# the Python package's pytest suite included (it runs the installed package).
test: build test-deps torch-deps emulator-deps python
	@cd $(BUILD_DIR) && ctest --output-on-failure -LE gpu -j 2

# The sanitizer and fuzz builds compile at -O1 with line tables only (-g1):
# what ASan's reports need (function, file and line of every frame), at half
# the compile time of RelWithDebInfo's -O2 -g (measured on one gRPC reactor
# under ASan and UBSan: 14 s against 32 s).
SANITIZE_OPT ?= -O1 -g1 -DNDEBUG

# The CPU tests again under AddressSanitizer, LeakSanitizer and UBSan (the
# daemon processes the tests start are instrumented too; a leak makes the
# daemon exit non-zero, which the tests check). Tests labelled `rss` measure
# the daemon's resident memory, which ASan's allocator keeps, or read glibc's
# heap, which ASan replaces: `make test` runs them.
sanitize: test-deps torch-deps emulator-deps
	@cmake -S . -B $(BUILD_DIR)-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPTSTATE_WITH_CUDA=OFF \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SANITIZE_OPT)" \
	  -DOPTSTATE_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" \
	  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > $(BUILD_DIR)-asan.configure.log
	@cmake --build $(BUILD_DIR)-asan -j $(JOBS)
	@cd $(BUILD_DIR)-asan && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ctest --output-on-failure -LE 'gpu|rss' -j 2

# Coverage-guided fuzzing of the daemon's Step input and of its credential
# input (the tokens file, authorization metadata, SPIFFE IDs; tests/fuzz/)
# with libFuzzer, ASan and UBSan, from the seeds, for FUZZ_SECONDS each. A
# crash or broken invariant stops it and leaves the input in the current
# directory; `$(BUILD_DIR)-fuzz/tests/fuzz/step_input_smoke FILE` replays it.
FUZZ_SECONDS ?= 60
fuzz:
	@bash scripts/install-deps.sh fuzz
	@CC=clang CXX=clang++ cmake -S . -B $(BUILD_DIR)-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SANITIZE_OPT)" \
	  -DOPTSTATE_WITH_CUDA=OFF -DOPTSTATE_BUILD_BENCH=OFF -DOPTSTATE_LIBFUZZER=ON \
	  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > $(BUILD_DIR)-fuzz.configure.log
	@cmake --build $(BUILD_DIR)-fuzz -j $(JOBS) --target step_input_fuzz step_input_smoke \
	  auth_input_fuzz auth_input_smoke
	@mkdir -p $(BUILD_DIR)-fuzz/corpus $(BUILD_DIR)-fuzz/auth_corpus
	@$(BUILD_DIR)-fuzz/tests/fuzz/step_input_smoke --write_seeds=$(BUILD_DIR)-fuzz/corpus
	@$(BUILD_DIR)-fuzz/tests/fuzz/auth_input_smoke --write_seeds=$(BUILD_DIR)-fuzz/auth_corpus
	$(BUILD_DIR)-fuzz/tests/fuzz/step_input_fuzz -max_total_time=$(FUZZ_SECONDS) \
	  $(BUILD_DIR)-fuzz/corpus
	$(BUILD_DIR)-fuzz/tests/fuzz/auth_input_fuzz -max_total_time=$(FUZZ_SECONDS) \
	  $(BUILD_DIR)-fuzz/auth_corpus

bench: build
	@bash bench/run.sh

# DeepSpeed's CPU Adam (DeepSpeedCPUAdam, JIT-built on first use) against the
# CPU kernel and the memory pass, same run: 64M fp32 elements, 2 threads,
# interleaved repetitions (ARGS go to the script, e.g. ARGS=--repetitions=9).
# Installs deepspeed into .torch-venv when missing.
bench-deepspeed: configure
	@bash scripts/install-deepspeed.sh
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target kernel_bench
	.torch-venv/bin/python3 bench/python/deepspeed_cpu_adam.py --kernel=$(BUILD_DIR)/bench/kernel $(ARGS)

# A small model trained through the remote optimizer, daemon started alongside.
demo: build
	@bash scripts/demo.sh $(BUILD_DIR)

gpu-test:
	@bash tests/gpu/run.sh

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR).configure.log

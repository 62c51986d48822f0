# optstate: `make run` starts the daemon, `make test` runs the test suite.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
LISTEN ?= 127.0.0.1:50051
ARGS ?=

.PHONY: deps configure build run test bench demo gpu-test clean

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) > $(BUILD_DIR).configure.log 2>&1 \
	  || (cat $(BUILD_DIR).configure.log; exit 1)

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Starts optstated in the foreground with defaults that work without a GPU.
run: build
	$(BUILD_DIR)/server/optstated --listen=$(LISTEN) $(ARGS)

# Every test that needs no GPU (tests labelled gpu run via tests/gpu/run.sh).
test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -LE gpu -j 2

bench: build
	@bash bench/run.sh

# A small model trained through the remote optimizer, daemon started alongside.
demo: build
	@bash scripts/demo.sh $(BUILD_DIR)

gpu-test:
	@bash tests/gpu/run.sh

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR).configure.log

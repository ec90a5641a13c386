# Thin wrapper over CMake: `make` builds build/bin/mlxcel and mlxcel-server, `make test` runs
# every test through ctest. Pass CMAKE_ARGS to configure (e.g. CMAKE_ARGS=-DMLXCEL_CUDA=OFF).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all test deps demo fuzz clean format
all: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)

# Installs the Debian packages and the JavaScript references when missing (no-op otherwise).
deps:
	tools/install-deps.sh

test: deps all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The main job: the embedded demo model continues a story. A plain continuation (--raw): the
# toy model's chat turns end after a few words. Seeded sampling with a mild repeat penalty,
# as greedy decoding loops; the seed makes every fresh clone print the same story.
demo: deps all
	$(BUILD)/bin/mlxcel run --raw -p "Once upon a time" -n 60 --temp 0.7 --repeat-penalty 1.1 --seed 3

# Builds the fuzz targets with clang and the sanitizers (build-fuzz/) and runs each for
# FUZZ_SECONDS; see fuzz/run.sh.
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)

# The two commands the README opens with: `make run` (the main job) and `make test` (the tests).
PRESET ?= default
BUILD  := build/$(PRESET)
JOBS   ?= $(shell nproc)

.PHONY: deps configure build test run bench bench-mpi clean

deps:
	@bash scripts/deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	@ctest --preset $(PRESET) -j $(JOBS)

run: build
	@./$(BUILD)/cli/zerocheck verify --profile default --out reports/out

bench: build
	@./$(BUILD)/bench/zc_bench

bench-mpi: build
	@mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root) -np 4 ./$(BUILD)/bench/zc_mpi_bench

clean:
	@rm -rf build

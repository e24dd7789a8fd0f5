# The two commands the README opens with: `make run` (the main job) and `make test` (the tests).
PRESET ?= default
BUILD  := build/$(PRESET)
JOBS   ?= $(shell nproc)

.PHONY: deps ds-env configure build test test-asan run verify-deepspeed bench bench-plan bench-verify-mpi bench-mpi bench-deepspeed seed-table bisect gpu-check \
        soak-deepspeed \
        fuzz clean

deps:
	@bash scripts/deps.sh

# The DeepSpeed reference's Python environment (outside the checkout, reused; label deepspeed needs it).
ds-env:
	@bash scripts/ds-env.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

test: build ds-env
	@ctest --preset $(PRESET) -j $(JOBS)

# The unit and prop labels under Address and UB sanitizers (preset asan: a debug build that halts
# at the first finding, which fails its test). CI runs it after `make test`.
test-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	@UBSAN_OPTIONS=print_stacktrace=1 ctest --preset asan -L "unit|prop" -j $(JOBS)

run: build
	@./$(BUILD)/cli/zerocheck verify --profile default --out reports/out

bench: build
	@./$(BUILD)/bench/zc_bench

bench-plan: build
	@./$(BUILD)/bench/zc_plan_bench

# The DeepSpeed reference campaign the docs' figures come from: 100 generated scenarios of seed
# 20261129 compared with DeepSpeed, values, collectives and memory (ctest runs 30 of them);
# reports/verify-deepspeed/report.md.
verify-deepspeed: build ds-env
	@./$(BUILD)/cli/zerocheck verify --against deepspeed --only deepspeed --deepspeed-cases 100 \
	  --deepspeed-i3 autosp:0,autotp:0 --jobs 1 --out reports/verify-deepspeed

# The DeepSpeed reference soak: fresh seeds for $(BUDGET) (default 30m), every scenario compared and
# counted (matched, listed by class, unlisted), the coverage grid; reports/soak-deepspeed/deepspeed.md.
soak-deepspeed: build ds-env
	@./$(BUILD)/cli/zerocheck verify --against deepspeed --only deepspeed --budget $(or $(BUDGET),30m) \
	  --deepspeed-cases 100 --jobs 1 --out reports/soak-deepspeed

# The seeds' before/after table on the DeepSpeed releases and the source tree that shipped and
# fixed their bugs (docs/deepspeed-releases.md), and the release bisect of one seed invariant.
seed-table: build ds-env
	@bash scripts/seed-table.sh $(BUILD)

bisect: build ds-env
	@./$(BUILD)/cli/zerocheck bisect --against deepspeed --invariant $(or $(INVARIANT),I4) $(if $(RELEASES),--releases $(RELEASES))

bench-deepspeed: build ds-env
	@./$(BUILD)/bench/zc_reference_bench

# The verify job at K = 1 and 2 MPI ranks (--jobs 1 each): wall time and the speed-up.
bench-verify-mpi: build
	@bash scripts/bench-verify-mpi.sh $(or $(PROFILE),default) --no-proofs

bench-mpi: build
	@mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root) -np 4 ./$(BUILD)/bench/zc_mpi_bench

# On a GPU machine: build, gpu tests, verify-real --backend cuda, GPU benchmarks, a short table.
gpu-check:
	@bash scripts/gpu-check.sh

# The fuzz campaign (preset fuzz, clang with ASan and UBSan): 10 million executions per target by
# default; FUZZ_ARGS="--seconds 300" or "--runs N --targets config" for a shorter one.
fuzz: deps
	@bash scripts/fuzz-campaign.sh $(FUZZ_ARGS)

clean:
	@rm -rf build

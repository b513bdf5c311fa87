# tests/bench/: benchmarks run by `make bench` (tests/run-bench.sh).  Each
# prints its figures beside baselines measured in the same run.

# Benchmarks of the core: tests/bench/bench_core*.c, each linked with the core.
# Built by `make` too, so that they never stop compiling.
MOD_CFLAGS_tests_bench_ = $(call DEP_CFLAGS,libxxhash)
CORE_BENCHES := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/bench/bench_core*.c))
BENCHES += $(CORE_BENCHES)
all: $(CORE_BENCHES)
$(CORE_BENCHES): $(BUILD)/%: $(BUILD)/%.o $(BUILD)/libkvscore.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(CORE_LIBS) -lm

# The replayer against a Python LRU simulation of the same trace.
BENCHES += tests/bench/bench_replay.sh
# Hit rate of one pool against the same users over per-tenant partitions.
BENCHES += tests/bench/bench_tenants.sh
BENCHES += tests/bench/bench_call_instructions.sh
BENCHES += tests/bench/bench_python.py
BENCHES += tests/bench/bench_metrics.py
BENCHES += tests/bench/bench_events.py
BENCHES += tests/bench/bench_remote.py

# tests/fuzz/: protocol fuzzing of the daemon's input path.
#
#   test_fuzz_dispatch  (make test) the in-process target: frames -> codecs
#                       -> dispatch -> core -> codecs, deterministic inputs
#   test_fuzz_daemon    (make test) a real kvshared under thousands of mutated
#                       and garbage frames from several connections, beside
#                       well-behaved clients whose results are checked
#   test_fuzz_build.sh  (make test) fuzz_main: exactly the sources `make fuzz`
#                       compiles (FUZZ_SRCS), linked as it links them, run
#                       over a generated corpus with ring requests
#   make fuzz           the same target under libFuzzer (clang, ASan, UBSan)
#                       for FUZZ_TIME seconds (default 60); not part of test
MOD_CFLAGS_tests_fuzz_ = $(call DEP_CFLAGS,libuv libprotobuf-c)

FUZZ_TARGET_SRCS := tests/fuzz/fuzz_dispatch.c daemon/dispatch/dispatch.c \
                    daemon/dispatch/reqmap.c daemon/tiers/tiers.c \
                    daemon/log.c daemon/config.c
FUZZ_TARGET_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(FUZZ_TARGET_SRCS))
FUZZ_GEN_OBJS := $(BUILD)/tests/fuzz/fuzz_gen.o
$(FUZZ_GEN_OBJS) $(BUILD)/tests/fuzz/fuzz_dispatch.o \
  $(BUILD)/tests/fuzz/test_fuzz_dispatch.o \
  $(BUILD)/tests/fuzz/test_fuzz_daemon.o: | $(PROTO_GEN_H)

UNIT_TESTS += $(BUILD)/tests/fuzz/test_fuzz_dispatch $(BUILD)/tests/fuzz/test_fuzz_daemon
$(BUILD)/tests/fuzz/test_fuzz_dispatch: $(BUILD)/tests/fuzz/test_fuzz_dispatch.o \
    $(FUZZ_TARGET_OBJS) $(FUZZ_GEN_OBJS) $(BUILD)/libkvscore.a $(BUILD)/libkvsproto.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(FUZZ_TARGET_OBJS) $(FUZZ_GEN_OBJS) \
	  $(CORE_LIBS) $(BUILD)/libkvsproto.a $(PROTO_LIBS) -lm

$(BUILD)/tests/fuzz/test_fuzz_daemon: $(BUILD)/tests/fuzz/test_fuzz_daemon.o \
    $(FUZZ_GEN_OBJS) $(BUILD)/libkvsproto.a $(BUILD)/libkvsshm.a | $(BUILD)/kvshared
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(FUZZ_GEN_OBJS) $(BUILD)/libkvsshm.a \
	  $(BUILD)/libkvsproto.a $(PROTO_LIBS)

# libFuzzer: clang 14 with libclang-rt-14-dev, installed when missing by
# deploy/install-deps.sh --fuzz (only for these targets).
FUZZ_CC   ?= clang-14
FUZZ_TIME ?= 60
FUZZ_JOBS ?= 1
# FUZZ_COV=-fno-sanitize-coverage=trace-cmp: about 2.5x the inputs a second
# (no comparison tracing), for long campaigns seeded by the generator.
FUZZ_COV  ?=
FUZZ_DIR  := $(BUILD)/fuzz
FUZZ_SRCS := $(FUZZ_TARGET_SRCS) $(wildcard daemon/core/*.c) \
             $(filter-out %.pb-c.c,$(patsubst $(BUILD)/%.o,%.c,$(PROTO_OBJS))) \
             $(PROTO_GEN_C)
# fuzz_main: FUZZ_SRCS (below) built by this build's compiler and flags and
# linked with the libraries the libFuzzer link names, so that a source
# missing from the list fails `make test`, not the next campaign.
FUZZ_MAIN_OBJS = $(patsubst %.c,$(BUILD)/%.o,$(filter-out $(BUILD)/%,$(FUZZ_SRCS))) \
                 $(patsubst %.c,%.o,$(filter $(BUILD)/%,$(FUZZ_SRCS)))
all: $(BUILD)/tests/fuzz/fuzz_main
$(BUILD)/tests/fuzz/fuzz_main.o: | $(PROTO_GEN_H)
$(BUILD)/tests/fuzz/fuzz_main: $(BUILD)/tests/fuzz/fuzz_main.o $(FUZZ_MAIN_OBJS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ \
	  $(call DEP_LIBS,libprotobuf-c libxxhash) -lm
TEST_SCRIPTS += tests/fuzz/test_fuzz_build.sh

.PHONY: fuzz fuzz-build
fuzz-build: $(FUZZ_DIR)/fuzz_dispatch
$(FUZZ_DIR)/fuzz_dispatch: $(FUZZ_SRCS) $(wildcard daemon/*.h daemon/*/*.h \
    proto/*.h shm/*.h tests/fuzz/*.h) | $(PROTO_GEN_H)
	@mkdir -p $(dir $@)
	$(Q)command -v $(FUZZ_CC) >/dev/null && \
	  ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a \
	  >/dev/null 2>&1 || deploy/install-deps.sh --fuzz
	@$(if $(Q),echo "  FUZZCC  $@")
	$(Q)$(FUZZ_CC) -std=gnu11 -O1 -g -fno-omit-frame-pointer \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $(FUZZ_COV) \
	  $(CPPFLAGS) $(call DEP_CFLAGS,libuv libprotobuf-c libxxhash) -o $@ \
	  $(FUZZ_SRCS) $(call DEP_LIBS,libprotobuf-c libxxhash) -lm

fuzz: $(FUZZ_DIR)/fuzz_dispatch $(BUILD)/tests/fuzz/test_fuzz_dispatch
	@mkdir -p $(FUZZ_DIR)/corpus
	$(Q)$(BUILD)/tests/fuzz/test_fuzz_dispatch --corpus $(FUZZ_DIR)/corpus 256
	$(Q)$(FUZZ_DIR)/fuzz_dispatch -max_total_time=$(FUZZ_TIME) -max_len=65536 \
	  -timeout=10 -rss_limit_mb=2048 $(FUZZ_DIR)/corpus

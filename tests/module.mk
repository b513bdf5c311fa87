# tests/: unit (cmocka), integration, bench.
TEST_CFLAGS = $(call DEP_CFLAGS,cmocka)
TEST_LIBS   = $(call DEP_LIBS,cmocka)
MOD_CFLAGS_tests_unit_ = $(TEST_CFLAGS)

# Unit tests of the core: tests/unit/test_core_*.c, each linked with the core.
CORE_TESTS := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/unit/test_core*.c))
UNIT_TESTS += $(CORE_TESTS)
$(CORE_TESTS): $(BUILD)/%: $(BUILD)/%.o $(BUILD)/libkvscore.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(CORE_LIBS) $(TEST_LIBS) -lm

# The trace replayer: tests/unit/test_replay*.c, linked with the replayer's
# objects (tools/replay/) and the core.
REPLAY_TEST_OBJS = $(REPLAY_OBJS)
REPLAY_TESTS := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/unit/test_replay*.c))
UNIT_TESTS += $(REPLAY_TESTS)
$(REPLAY_TESTS): $(BUILD)/%: $(BUILD)/%.o $(REPLAY_TEST_OBJS) $(BUILD)/libkvscore.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(REPLAY_TEST_OBJS) $(CORE_LIBS) \
	  $(call DEP_LIBS,jansson) $(TEST_LIBS) -lm
TEST_SCRIPTS += tests/unit/test_replay_cli.sh tests/unit/test_replay_tenants.sh \
                tests/unit/test_replay_bytes.sh \
                tests/unit/test_layers.sh

# The remote tier's reply gate (daemon/tiers/resp_gate.c: pure).
UNIT_TESTS += $(BUILD)/tests/unit/test_resp_gate
$(BUILD)/tests/unit/test_resp_gate: $(BUILD)/tests/unit/test_resp_gate.o \
                                    $(BUILD)/daemon/tiers/resp_gate.o
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(TEST_LIBS)

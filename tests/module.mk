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

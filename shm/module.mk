# shm/: the layout header (kvs_layout.h) and what processes share: memfd
# regions and fd passing (kvs_shm.h).  Link users with $(BUILD)/libkvsshm.a
# (internal, -fPIC, not installed).
SHM_OBJS := $(BUILD)/shm/kvs_shm.o $(BUILD)/shm/kvs_ring.o

$(BUILD)/libkvsshm.a: $(SHM_OBJS)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

# Unit tests: tests/unit/test_shm*.c, linked with libkvsshm.a and the status
# codes.
SHM_TESTS := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/unit/test_shm*.c))
UNIT_TESTS += $(SHM_TESTS)
$(SHM_TESTS): $(BUILD)/%: $(BUILD)/%.o $(BUILD)/libkvsshm.a $(BUILD)/libkvsproto.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libkvsshm.a $(BUILD)/libkvsproto.a \
	  $(PROTO_LIBS) $(TEST_LIBS)

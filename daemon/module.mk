# daemon/: the pure core (daemon/core/) and the I/O layer around it.
CORE_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard daemon/core/*.c))
MOD_CFLAGS_daemon_core_ := $(call DEP_CFLAGS,libxxhash)

$(BUILD)/libkvscore.a: $(CORE_OBJS) $(PROTO_OBJS)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

CORE_LIBS = $(BUILD)/libkvscore.a $(call DEP_LIBS,libxxhash)

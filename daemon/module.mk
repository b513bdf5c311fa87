# daemon/: the pure core (daemon/core/) and the I/O layer around it.
CORE_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard daemon/core/*.c))
MOD_CFLAGS_daemon_core_ := $(call DEP_CFLAGS,libxxhash)

$(BUILD)/libkvscore.a: $(CORE_OBJS) $(PROTO_OBJS)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

CORE_LIBS = $(BUILD)/libkvscore.a $(call DEP_LIBS,libxxhash)

# kvshared: the I/O layer (daemon/*.c) around the core.
DAEMON_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard daemon/*.c))
MOD_CFLAGS_daemon_ := $(call DEP_CFLAGS,libuv libprotobuf-c liburing jansson libxxhash)
DAEMON_LIBS = $(call DEP_LIBS,libuv libprotobuf-c liburing jansson) -lm
PROGRAMS += $(BUILD)/kvshared
$(BUILD)/kvshared: $(DAEMON_OBJS) $(SHM_OBJS) $(BUILD)/libkvscore.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(DAEMON_OBJS) $(SHM_OBJS) $(CORE_LIBS) $(DAEMON_LIBS)

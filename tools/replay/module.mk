# tools/replay/: kvshare-replay, the trace replayer.  It runs the core
# in-process over a Mooncake-format trace (no loop, no socket), so it links
# the core library and jansson and nothing of the daemon's I/O layer.
# `kvshared replay ...` runs it too (daemon/main.c execs the kvshare-replay
# installed beside kvshared).
REPLAY_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(filter-out tools/replay/main.c,$(wildcard tools/replay/*.c)))
MOD_CFLAGS_tools_replay_ := $(call DEP_CFLAGS,jansson libxxhash)
PROGRAMS += $(BUILD)/kvshare-replay
$(BUILD)/kvshare-replay: $(BUILD)/tools/replay/main.o $(REPLAY_OBJS) $(BUILD)/libkvscore.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(REPLAY_OBJS) $(CORE_LIBS) $(call DEP_LIBS,jansson) -lm

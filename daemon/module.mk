# daemon/: the pure core (daemon/core/) and the I/O layer around it.
CORE_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard daemon/core/*.c))
MOD_CFLAGS_daemon_core_ := $(call DEP_CFLAGS,libxxhash)

$(BUILD)/libkvscore.a: $(CORE_OBJS) $(PROTO_OBJS)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

CORE_LIBS = $(BUILD)/libkvscore.a $(call DEP_LIBS,libxxhash)

# kvshared: the I/O layer around the core, one folder per room
# (docs/architecture.md): net/ (sessions, rings), dispatch/ (ops -> core),
# tiers/ (the tiers below the pool), pool/ (the memory behind it and the
# copy engine), observe/ (metrics, KV events), and daemon/*.c (start-up,
# options, the log).  Both pool backends are built in (pool/backend_host.c:
# memfd; pool/backend_cuda.c: GPU memory through gpu/vmm.c, whose driver is
# dlopen'ed at run time) and pool/backend.c picks one at start-up.
DAEMON_DIRS := daemon daemon/net daemon/dispatch daemon/part daemon/tiers daemon/pool daemon/observe
DAEMON_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(foreach d,$(DAEMON_DIRS),$(wildcard $(d)/*.c)))
DAEMON_PKGS := libuv libprotobuf-c liburing libmicrohttpd libzmq msgpack libsystemd hiredis
$(foreach d,$(DAEMON_DIRS),$(eval MOD_CFLAGS_$(subst /,_,$(d))_ := $(call DEP_CFLAGS,$(DAEMON_PKGS) libxxhash)))
DAEMON_LIBS = $(call DEP_LIBS,$(DAEMON_PKGS)) $(GPU_LIBS)
PROGRAMS += $(BUILD)/kvshared
$(DAEMON_OBJS): | $(PROTO_GEN_H)
$(BUILD)/kvshared: $(DAEMON_OBJS) $(BUILD)/libkvsshm.a $(BUILD)/libkvscore.a \
                   $(BUILD)/libkvsproto.a $(BUILD)/libkvsgpu.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(DAEMON_OBJS) $(BUILD)/libkvsshm.a $(CORE_LIBS) \
	  $(BUILD)/libkvsgpu.a $(BUILD)/libkvsproto.a $(DAEMON_LIBS)

# Unit tests of the configuration: tests/unit/test_config*.c, linked with the
# option table (and the core, for its policy names; no loop).
CONFIG_TESTS := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/unit/test_config*.c))
UNIT_TESTS += $(CONFIG_TESTS)
$(CONFIG_TESTS): $(BUILD)/%: $(BUILD)/%.o $(BUILD)/daemon/config.o \
                 $(BUILD)/libkvscore.a $(BUILD)/libkvsproto.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/daemon/config.o $(BUILD)/libkvscore.a \
	  $(BUILD)/libkvsproto.a $(CORE_LIBS) $(PROTO_LIBS) $(TEST_LIBS)

# Unit tests of the KV event stream: tests/unit/test_events*.c, linked with
# the events module, the log, the option table and the core (a real loop
# and ZMQ sockets on ipc:// endpoints).
EVENTS_TEST_OBJS := $(BUILD)/daemon/observe/events.o \
                    $(BUILD)/daemon/observe/tcpinfo.o $(BUILD)/daemon/log.o \
                    $(BUILD)/daemon/config.o
EVENTS_TESTS := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/unit/test_events*.c))
UNIT_TESTS += $(EVENTS_TESTS)
$(EVENTS_TESTS:%=%.o): | $(PROTO_GEN_H)
$(EVENTS_TESTS:%=%.o): CPPFLAGS += $(call DEP_CFLAGS,libuv libzmq msgpack)
$(EVENTS_TESTS): $(BUILD)/%: $(BUILD)/%.o $(EVENTS_TEST_OBJS) \
                 $(BUILD)/libkvscore.a $(BUILD)/libkvsproto.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(EVENTS_TEST_OBJS) $(CORE_LIBS) \
	  $(BUILD)/libkvsproto.a $(PROTO_LIBS) \
	  $(call DEP_LIBS,libuv libzmq msgpack) $(TEST_LIBS)

# `make install`: the example config and the systemd unit, for the admin to
# copy into /etc (see docs/operations.md); the unit runs $(PREFIX)/bin/kvshared.
define KVS_DAEMON_INSTALL

install -d $(DESTDIR)$(PREFIX)/share/kvshare
install -m 644 deploy/kvshared.conf deploy/kvshared.socket deploy/kvshare.sysusers $(DESTDIR)$(PREFIX)/share/kvshare/
sed -e 's|/usr/local/bin/kvshared|$(PREFIX)/bin/kvshared|' deploy/kvshared.service >$(DESTDIR)$(PREFIX)/share/kvshare/kvshared.service
endef
INSTALL_EXTRA += $(KVS_DAEMON_INSTALL)

# bench_tiers: the tiers' byte movers (tier_disk.c, the copy engine on the
# host pool) against fio and memcpy; linked with the daemon's objects but
# its main.
TIER_BENCH_OBJS := $(filter-out $(BUILD)/daemon/main.o,$(DAEMON_OBJS))
$(BUILD)/tests/bench/bench_tiers.o: | $(PROTO_GEN_H)
$(BUILD)/tests/bench/bench_tiers.o: CPPFLAGS += $(call DEP_CFLAGS,libuv liburing)
$(BUILD)/tests/bench/bench_tiers: $(BUILD)/tests/bench/bench_tiers.o $(TIER_BENCH_OBJS) \
    $(BUILD)/libkvsshm.a $(BUILD)/libkvscore.a $(BUILD)/libkvsproto.a $(BUILD)/libkvsgpu.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(TIER_BENCH_OBJS) $(BUILD)/libkvsshm.a $(CORE_LIBS) \
	  $(BUILD)/libkvsgpu.a $(BUILD)/libkvsproto.a $(DAEMON_LIBS)
BENCHES += $(BUILD)/tests/bench/bench_tiers
all: $(BUILD)/tests/bench/bench_tiers

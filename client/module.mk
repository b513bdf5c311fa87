# client/: libkvshare, the kvshare CLI, the Python binding.
#
#   $(BUILD)/libkvshare.so.$(KVS_SOVERSION) (+ libkvshare.so.0, libkvshare.so)
#   $(BUILD)/kvshare                         the CLI
# Users link with: -L$(BUILD) -lkvshare  and include client/kvshare.h (which
# needs -Igpu -Ishm -Iproto on the include path: $(CLIENT_CFLAGS)).
# Integration tests (tests/integration/), the client benchmarks
# (tests/bench/bench_client*, bench_rtt*) and the demo workers
# (tests/demo/worker*.c) are built here too: they are the client's users.
kvs_comma     := ,
KVS_VERSION   := 0.1.0
KVS_SOVERSION := 0
CLIENT_CFLAGS := -Igpu $(call DEP_CFLAGS,libprotobuf-c)
MOD_CFLAGS_client_ := $(CLIENT_CFLAGS)

CLIENT_LIB_OBJS := $(BUILD)/client/conn.o $(BUILD)/client/ops.o $(BUILD)/client/ring.o \
                   $(BUILD)/client/batch.o $(BUILD)/client/sockdir.o \
                   $(BUILD)/client/sockpath.o
$(CLIENT_LIB_OBJS) $(BUILD)/client/kvshare_cli.o: | $(PROTO_GEN_H)

# The kernels are linked in whole (and re-exported) once gpu/ builds them.
CLIENT_GPU_LIB := $(if $(strip $(GPU_OBJS)),$(BUILD)/libkvsgpu.a)
CLIENT_GPU_LINK := $(if $(CLIENT_GPU_LIB),-Wl$(kvs_comma)--whole-archive \
  $(CLIENT_GPU_LIB) -Wl$(kvs_comma)--no-whole-archive $(GPU_LIBS))
CLIENT_SO      := $(BUILD)/libkvshare.so.$(KVS_VERSION)
CLIENT_SONAME  := libkvshare.so.$(KVS_SOVERSION)

# kvs_status.o is linked whole: kvs_strerror is public.
$(CLIENT_SO): $(CLIENT_LIB_OBJS) $(BUILD)/libkvsproto.a $(BUILD)/libkvsshm.a \
              $(CLIENT_GPU_LIB) \
              client/libkvshare.map
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,$(CLIENT_SONAME) \
	  -Wl,--version-script=client/libkvshare.map -o $@ $(CLIENT_LIB_OBJS) \
	  $(BUILD)/proto/kvs_status.o \
	  $(CLIENT_GPU_LINK) \
	  $(BUILD)/libkvsshm.a $(BUILD)/libkvsproto.a $(PROTO_LIBS)
$(BUILD)/$(CLIENT_SONAME) $(BUILD)/libkvshare.so: $(CLIENT_SO)
	$(Q)ln -sf $(notdir $(CLIENT_SO)) $@

CLIENT_LINK = -L$(BUILD) -lkvshare
# Programs in $(BUILD) find the library beside them, installed ones in ../lib.
CLIENT_RPATH = -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../lib'
CLIENT_DEPS := $(CLIENT_SO) $(BUILD)/$(CLIENT_SONAME) $(BUILD)/libkvshare.so

PROGRAMS += $(BUILD)/kvshare
# (sockpath.o is in libkvshare too, but not among its exported symbols.)
KVSHARE_CLI_OBJS := $(BUILD)/client/kvshare_cli.o $(BUILD)/client/top.o \
                    $(BUILD)/client/sockpath.o
$(BUILD)/kvshare: $(KVSHARE_CLI_OBJS) $(CLIENT_DEPS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(KVSHARE_CLI_OBJS) \
	  $(CLIENT_LINK) $(CLIENT_RPATH)

all: $(CLIENT_DEPS)

# ---- tests, benchmarks and demo workers that use libkvshare ---------------
# Each tests/integration/test_*.c is one program, linked with itest.c (a
# small harness that starts a real kvshared) and libkvshare; test_*.sh are
# scripts.  They need kvshared and the CLI built.
# (Target-specific, since tests/bench/ and tests/demo/ are shared folders.)
MOD_CFLAGS_tests_integration_ := $(CLIENT_CFLAGS)
ITEST_OBJ := $(BUILD)/tests/integration/itest.o
ITEST_PROGS := $(filter-out $(BUILD)/tests/integration/test_gpu_pool \
  $(BUILD)/tests/integration/test_gpu_tiers,\
  $(patsubst %.c,$(BUILD)/%,$(wildcard tests/integration/test_*.c)))
ITEST_LINK = $(ITEST_OBJ) $(CLIENT_LINK) $(BUILD)/libkvsshm.a $(BUILD)/libkvsproto.a \
             $(PROTO_LIBS) \
             -Wl,-rpath,'$$ORIGIN/../..'
$(ITEST_PROGS:%=%.o) $(ITEST_OBJ): | $(PROTO_GEN_H)
$(ITEST_PROGS): $(BUILD)/%: $(BUILD)/%.o $(ITEST_OBJ) $(CLIENT_DEPS) $(BUILD)/libkvsshm.a \
                $(BUILD)/libkvsproto.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(ITEST_LINK) -lm
UNIT_TESTS += $(ITEST_PROGS)
TEST_SCRIPTS += $(sort $(wildcard tests/integration/test_*.sh))
# The tests start the daemon and call the CLI: build them with the tests.
$(ITEST_PROGS): | $(BUILD)/kvshared $(BUILD)/kvshare

CLIENT_BENCHES := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/bench/bench_client*.c tests/bench/bench_rtt*.c))
$(CLIENT_BENCHES:%=%.o): | $(PROTO_GEN_H)
$(CLIENT_BENCHES): $(BUILD)/%: $(BUILD)/%.o $(ITEST_OBJ) $(CLIENT_DEPS) $(BUILD)/libkvsshm.a \
                   $(BUILD)/libkvsproto.a | $(BUILD)/kvshared
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(BENCH_CORE) $(ITEST_LINK) -lm
$(CLIENT_BENCHES:%=%.o): CPPFLAGS += $(CLIENT_CFLAGS)
# bench_rtt runs the core in-process too (the lookup's baseline).
$(BUILD)/tests/bench/bench_rtt: $(BUILD)/libkvscore.a
$(BUILD)/tests/bench/bench_rtt: BENCH_CORE = $(CORE_LIBS) $(call DEP_LIBS,libuv)
$(BUILD)/tests/bench/bench_rtt.o: CPPFLAGS += $(call DEP_CFLAGS,libxxhash libuv)
# (bench_client_remote is a client bench_remote.py runs with its
# arguments, not a benchmark of its own.)
BENCHES += $(filter-out %/bench_client_remote,$(CLIENT_BENCHES))
all: $(CLIENT_BENCHES)

# test_gpu_pool, test_gpu_tiers and bench_gpu_pool link the client and
# gpu/ statically,
# not libkvshare.so: they call gpu/vmm.c itself too (the GPU's free memory,
# a create to time an import against), with one copy of the driver's state.
# (The demo workers, on libkvshare.so, run the same cuda path in test_demo.)
GPU_POOL_PROGS := $(BUILD)/tests/integration/test_gpu_pool \
                  $(BUILD)/tests/integration/test_gpu_tiers \
                  $(BUILD)/tests/bench/bench_gpu_pool
$(GPU_POOL_PROGS:%=%.o): | $(PROTO_GEN_H)
$(GPU_POOL_PROGS:%=%.o): CPPFLAGS += $(CLIENT_CFLAGS)
$(GPU_POOL_PROGS): %: %.o $(ITEST_OBJ) $(CLIENT_LIB_OBJS) \
                   $(BUILD)/libkvsgpu.a $(BUILD)/libkvsshm.a \
                   $(BUILD)/libkvsproto.a | $(BUILD)/kvshared $(BUILD)/kvshare
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(ITEST_OBJ) $(CLIENT_LIB_OBJS) \
	  $(BUILD)/libkvsgpu.a $(BUILD)/libkvsshm.a $(BUILD)/libkvsproto.a \
	  $(PROTO_LIBS) $(GPU_LIBS) -lm
UNIT_TESTS += $(BUILD)/tests/integration/test_gpu_pool \
              $(BUILD)/tests/integration/test_gpu_tiers
BENCHES += $(BUILD)/tests/bench/bench_gpu_pool
all: $(GPU_POOL_PROGS)

DEMO_WORKERS := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/demo/worker*.c))
DEMO_MODEL_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/demo/toymodel.c))
$(DEMO_WORKERS:%=%.o): | $(PROTO_GEN_H)
$(DEMO_WORKERS:%=%.o): CPPFLAGS += $(CLIENT_CFLAGS)
$(DEMO_WORKERS): $(BUILD)/%: $(BUILD)/%.o $(DEMO_MODEL_OBJS) $(CLIENT_DEPS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(DEMO_MODEL_OBJS) $(CLIENT_LINK) \
	  -Wl,-rpath,'$$ORIGIN/../..' -lm
all: $(DEMO_WORKERS)

# ---- install: the library, its headers, pkg-config file ---------------------
# (kvshare and kvshared are in PROGRAMS and installed by the Makefile.)
define KVS_CLIENT_INSTALL

install -m 755 $(CLIENT_SO) $(DESTDIR)$(PREFIX)/lib/
ln -sf $(notdir $(CLIENT_SO)) $(DESTDIR)$(PREFIX)/lib/$(CLIENT_SONAME)
ln -sf $(CLIENT_SONAME) $(DESTDIR)$(PREFIX)/lib/libkvshare.so
install -m 644 client/kvshare.h proto/kvs_status.h shm/kvs_layout.h gpu/kvs_kernels.h $(DESTDIR)$(PREFIX)/include/kvshare/
sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(KVS_VERSION)|' client/kvshare.pc.in >$(DESTDIR)$(PREFIX)/lib/pkgconfig/kvshare.pc
endef
INSTALL_EXTRA += $(KVS_CLIENT_INSTALL)

# kvs_drive: a client scripted on stdin, for the tests written in other
# languages (tests/integration/test_observe.sh).
KVS_DRIVE := $(BUILD)/tests/integration/kvs_drive
$(KVS_DRIVE).o: | $(PROTO_GEN_H)
$(KVS_DRIVE): $(KVS_DRIVE).o $(CLIENT_DEPS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(CLIENT_LINK) -Wl,-rpath,'$$ORIGIN/../..'
all: $(KVS_DRIVE)

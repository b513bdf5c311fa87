# kvshare — top-level Makefile.
#
#   make            build everything into $(BUILD) (default: build/)
#   make test       unit + integration tests, then the same under ASan+UBSan
#   make bench      benchmarks (ratios against baselines measured in the same run)
#   make demo       start a daemon and run the shared-prompt demo
#   make engine     a PyTorch model on 4 engine processes: no cache, private
#                   caches, the shared cache (client/python/examples/engine)
#   make install    PREFIX=/usr/local DESTDIR=
#   make SAN=1      sanitizer build (into build-san/ unless BUILD is given)
#   V=1             print full command lines
#
# Each folder adds its sources, programs and tests in its own module.mk.

PREFIX  ?= /usr/local
DESTDIR ?=
SAN     ?= 0
ifeq ($(SAN),1)
BUILD   ?= build-san
else
BUILD   ?= build
endif

CC      ?= cc
PKG_CONFIG ?= pkg-config
PYTHON  ?= /usr/bin/python3
PKGS    := libuv libprotobuf-c liburing cmocka libxxhash jansson libmicrohttpd libzmq \
           msgpack libsystemd hiredis

# Build on every core unless a -j was given (make test builds two trees).
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

# Install what is missing before anything else (never for clean, or when told
# not to: KVS_NO_DEPS=1 builds only what needs no third-party library).
ifeq ($(filter clean help,$(MAKECMDGOALS)),)
ifneq ($(KVS_NO_DEPS),1)
# (nvdisasm: where nvcc is, for test_wgmma_ptx.sh's SASS check)
ifneq ($(shell $(PKG_CONFIG) --exists $(PKGS) 2>/dev/null && command -v promtool >/dev/null && \
               $(PYTHON) -c 'import importlib.util as u, sys; sys.exit(not u.find_spec("torch"))' \
               2>/dev/null && \
               { { ! command -v nvcc && [ ! -x /usr/local/cuda/bin/nvcc ]; } || \
                 command -v nvdisasm || [ -x /usr/local/cuda/bin/nvdisasm ] || \
                 [ -x /usr/local/lib/kvshare-tools/nvidia/cu13/bin/nvdisasm ]; } >/dev/null && \
               echo ok),ok)
$(info kvshare: some dependencies are missing; running deploy/install-deps.sh)
DEPS_RC := $(shell deploy/install-deps.sh 1>&2; echo $$?)
ifneq ($(DEPS_RC),0)
$(error kvshare: deploy/install-deps.sh failed (exit $(DEPS_RC)))
endif
endif
endif
endif

NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)

WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wno-unused-parameter
OPT      := -O2 -g
ifeq ($(SAN),1)
OPT      := -O1 -g -fno-omit-frame-pointer
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all
endif
CPPFLAGS += -D_GNU_SOURCE -I. -Ishm -Iproto -I$(BUILD)/proto
CFLAGS   += -std=gnu11 $(OPT) $(WARN) -fPIC -MMD -MP $(SANFLAGS)
LDFLAGS  += -Wl,-z,defs $(SANFLAGS)

ifneq ($(KVS_NO_DEPS),1)
DEP_CFLAGS = $(shell $(PKG_CONFIG) --cflags $(1))
DEP_LIBS   = $(shell $(PKG_CONFIG) --libs $(1))
endif

.PHONY: all test test-unit test-san bench demo engine install clean help
all:

# Lists the module fragments append to.
PROGRAMS   :=   # installed binaries
LIBS       :=   # installed libraries
UNIT_TESTS :=   # test programs run by `make test` (exit 0 pass, 77 skip)
TEST_SCRIPTS := # test scripts run by `make test` after the programs
BENCHES    :=   # benchmark programs or scripts run by `make bench`

include proto/module.mk shm/module.mk gpu/module.mk daemon/module.mk \
        client/module.mk tools/replay/module.mk tests/module.mk tests/bench/module.mk \
        tests/fuzz/module.mk tests/standin/module.mk

all: $(PROGRAMS) $(LIBS) $(UNIT_TESTS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(MOD_CFLAGS_$(subst /,_,$(dir $<))) -c -o $@ $<

# Each build tree keeps its own results: `make test` runs the plain build,
# then the sanitizer build in $(BUILD)-san/.
test:
	$(Q)$(MAKE) --no-print-directory test-unit
	$(Q)$(MAKE) --no-print-directory SAN=1 BUILD=$(patsubst %-san,%,$(BUILD))-san test-unit

test-unit: all
	$(Q)tests/run-tests.sh $(BUILD) $(UNIT_TESTS) $(TEST_SCRIPTS)

bench: all $(BENCHES)
	$(Q)deploy/install-deps.sh --bench || echo "(no fio: bench_tiers skips the disk tier)"
	$(Q)tests/run-bench.sh $(BUILD) $(BENCHES)

demo: all
	$(Q)tests/demo.sh $(BUILD)

# ENGINE_ARGS: options of run.py (--model small, --engines 8, --json, ...)
engine: all
	$(Q)KVS_BUILD=$(abspath $(BUILD)) $(PYTHON) client/python/examples/engine/run.py --faults $(ENGINE_ARGS)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/kvshare \
	  $(DESTDIR)$(PREFIX)/lib/pkgconfig
	$(if $(PROGRAMS),install -m 755 $(PROGRAMS) $(DESTDIR)$(PREFIX)/bin)
	$(if $(LIBS),install -m 644 $(LIBS) $(DESTDIR)$(PREFIX)/lib)
	$(INSTALL_EXTRA)

clean:
	rm -rf build build-san build-*

help:
	@sed -n '2,14p' Makefile

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

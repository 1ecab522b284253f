# Connex top-level targets. `make test` and `make demo` work on a fresh Debian 12 machine: they
# install what is missing (scripts/install-deps.sh), configure, build, then test / run.
JOBS ?= $(shell nproc)
# `make test`'s ctest jobs: twice the cores. Most of its tests wait (leases, timeouts, processes
# starting): on 2 cores, 4 jobs took 298 s with the CPU 70 % busy, 2 jobs 445 s
# (docs/development.md). The sanitizer runs keep one job per core: their tests are CPU-bound.
TEST_JOBS ?= $(shell echo $$(( 2 * $(JOBS) )))
CTEST_ARGS ?=
# `make demo ARGS=...` is the same as DEMO_ARGS=... (DEMO_ARGS wins when both are given).
ARGS ?=
DEMO_ARGS ?= $(ARGS)
# The test labels `make test-tsan` builds and runs (TSan covers the concurrent layers), and of
# the pd label the in-process binary (its end-to-end tests start the serving binaries, which
# the e2e label's ASan run covers).
TSAN_LABELS := directory elastic pp transport
TSAN_EXTRA_TARGETS := connex_pd_test
TSAN_EXCLUDE := ^PdE2eTest
empty :=
space := $(empty) $(empty)
TSAN_LABEL_REGEX := $(subst $(space),|,$(strip $(TSAN_LABELS)))|pd

.PHONY: all deps deps-packages deps-demo configure build build-asan build-tsan test test-asan test-tsan demo demo-configure demo-build demo-pd demo-mobile \
	demo-mobile-py bench fuzz clean

all: build

deps:
	@bash scripts/install-deps.sh

# The Debian packages alone: building needs no test data (npm).
deps-packages:
	@bash scripts/install-deps.sh --no-test-data

# The optional parts (cmake/optional_parts.cmake): ON, OFF or AUTO at configure time.
OPTIONAL_PARTS := CONNEX_ETCD CONNEX_UCX CONNEX_PYTHON

# What `make demo` needs alone: the demo programs' packages.
deps-demo:
	@bash scripts/install-deps.sh --demo

# The default tree with every optional part (etcd, UCX, Python) ON. A tree that `make demo`
# configured first has them AUTO (built if found: demo-configure); now that `deps` installed
# them all, they are turned ON (configure stops if one is still missing).
configure: deps
	@if [ ! -f build/CMakeCache.txt ]; then \
	  cmake --preset default; \
	else \
	  on=""; \
	  for part in $(OPTIONAL_PARTS); do \
	    grep -qi "^$$part:[A-Z]*=auto$$" build/CMakeCache.txt && on="$$on -D$$part=ON"; \
	  done; \
	  if [ -n "$$on" ]; then cmake --preset default $$on; fi; \
	fi

build: configure
	cmake --build build -j$(JOBS)

# The sanitizer trees build only what their ctest run needs (the connex-tests targets of the
# top-level CMakeLists.txt): no benchmarks, and for TSan only the labels it runs.
build-asan: deps
	@test -f build-asan/CMakeCache.txt || cmake --preset asan
	cmake --build build-asan -j$(JOBS) --target connex-tests-asan

build-tsan: deps
	@test -f build-tsan/CMakeCache.txt || cmake --preset tsan
	cmake --build build-tsan -j$(JOBS) --target $(addprefix connex-tests-,$(TSAN_LABELS)) $(TSAN_EXTRA_TARGETS)

test: build
	cd build && ctest --output-on-failure -j$(TEST_JOBS) $(CTEST_ARGS)

# The chaos campaigns (label chaos) and the namespace hosts (label hosts) run their real binaries
# in `make test`; under ASan they would only repeat the e2e label's processes at several times
# the cost (and the hosts' timing under ASan is not a deployment's). Under ASan the tests keep
# both cores busy, so the campaign runs its seeds one at a time there (four at once took both
# cores and slowed the real-tokenizer tests beside it by more than the campaign saved).
test-asan: build-asan
	cd build-asan && CONNEX_TEST_SEEDS=50 CONNEX_TEST_SEED_JOBS=1 ctest --output-on-failure -j$(JOBS) -LE '^(chaos|hosts)$$' -E '^(chaos_test|hosts_test|deploy_systemd_test|multihost_test|deploy_k8s_test)_NOT_BUILT$$' $(CTEST_ARGS)

# TSan covers the concurrent layers: directory, elastic, transport and pp.
test-tsan: build-tsan
	cd build-tsan && CONNEX_TEST_SEEDS=25 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tsan.supp" ctest --output-on-failure -j$(JOBS) -L '^($(TSAN_LABEL_REGEX))$$' -E '$(TSAN_EXCLUDE)' $(CTEST_ARGS)

# The binaries `make demo` runs (connex-chaos demo and what it starts): only these are built for it.
DEMO_TARGETS := connex-chaos connex-mkmodel connex-directory connex-stage connex-proxy connex-generate

# `make demo` on a fresh machine installs and builds what its programs need, no more: the optional
# parts are AUTO, so a machine that has them (after `make test`) builds the same tree as
# `make build` and one that does not leaves them out.
demo-configure: deps-demo
	@test -f build/CMakeCache.txt || \
	  cmake --preset default $(addprefix -D,$(addsuffix =AUTO,$(OPTIONAL_PARTS)))

demo-build: demo-configure
	cmake --build build -j$(JOBS) --target $(DEMO_TARGETS)

# The serving stack under load, a middle stage and a stage 0 SIGKILLed mid-generation
# (README.md, "Demo"; its flags in docs/configuration.md): a campaign of connex-chaos.
demo: demo-build
	./build/bin/connex-chaos demo $(DEMO_ARGS)

# Prefill-decode disaggregation under load, prefill and decode instances SIGKILLed in turn,
# beside a colocated pipeline on the same load (docs/design/pd.md): a campaign of connex-chaos.
PD_DEMO_ARGS ?= --kv-standby on --qps 4 --duration 20 --kill-every 5 --max-tokens 200
demo-pd: demo-build
	./build/bin/connex-chaos pd $(PD_DEMO_ARGS)

demo-mobile: configure
	cmake --build build -j$(JOBS) --target mobile_endpoints
	./build/bin/mobile_endpoints

# The same scenario through the Python bindings (examples/mobile_endpoints.py).
demo-mobile-py: configure
	cmake --build build -j$(JOBS) --target connex_python
	PYTHONPATH=build/python /usr/bin/python3 examples/mobile_endpoints.py

bench: build
	./build/bin/connex-bench transport --backend tcp --sizes 4K,64K,1M,16M --seconds 1
	./build/bin/bench_handover --runs 3

fuzz: deps
	@test -f build-fuzz/CMakeCache.txt || cmake --preset fuzz
	cmake --build build-fuzz --target fuzzers -j$(JOBS)
	@bash scripts/run-fuzzers.sh build-fuzz/bin 20

clean:
	rm -rf build build-asan build-tsan build-clang build-fuzz

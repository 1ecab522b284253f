# The optional parts: the etcd directory backend (gRPC, protobuf, etcd's .proto files), the UCX
# data plane and the Python bindings. Each of CONNEX_ETCD, CONNEX_UCX and CONNEX_PYTHON is
#   ON    built; configure stops naming what is missing and the package that installs it,
#   OFF   left out,
#   AUTO  built when what it needs is installed, else left out with a message saying what.
# `make demo` configures AUTO: on a fresh machine it installs only what the demo's programs need
# (scripts/install-deps.sh --demo); `make build` and `make test` install the rest and turn an AUTO
# tree's parts ON (Makefile, `configure`). Each switch is resolved here to ON or OFF in a normal
# variable of the same name, which every `if(CONNEX_ETCD)` below this directory then reads
# instead of the cache entry.

# connex_resolve_part(VAR PACKAGES [MISSING...]): VAR's value with MISSING (names of what was
# not found) applied; PACKAGES is what scripts/install-deps.sh installs for it.
function(connex_resolve_part var packages)
  set(missing ${ARGN})
  list(JOIN missing ", " missing)
  string(TOUPPER "${${var}}" value)
  if(NOT value MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|Y|N|1|0)$")
    message(FATAL_ERROR "${var}=${${var}}: ON, OFF or AUTO")
  endif()
  if(value STREQUAL "AUTO")
    if(missing)
      message(STATUS "${var}=AUTO: left out (not found: ${missing}; packages: ${packages})")
      set(${var} OFF PARENT_SCOPE)
    else()
      set(${var} ON PARENT_SCOPE)
    endif()
  elseif(${var})
    if(missing)
      message(FATAL_ERROR "${var}=ON but ${missing} not found: scripts/install-deps.sh installs "
                          "${packages}; -D${var}=OFF builds without it, AUTO when found")
    endif()
    set(${var} ON PARENT_SCOPE)
  else()
    set(${var} OFF PARENT_SCOPE)
  endif()
endfunction()

set(connex_etcd_missing)
if(CONNEX_ETCD)  # ON or AUTO
  find_package(Protobuf QUIET)
  find_package(gRPC CONFIG QUIET)
  find_program(CONNEX_GRPC_CPP_PLUGIN grpc_cpp_plugin)
  find_path(CONNEX_ETCD_PROTO_ROOT etcd/etcdserver/etcdserverpb/rpc.proto
            PATHS /usr/share/gocode/src/go.etcd.io NO_DEFAULT_PATH)
  find_path(CONNEX_GOGO_PROTO_ROOT gogoproto/gogo.proto
            PATHS /usr/share/gocode/src/github.com/gogo/protobuf NO_DEFAULT_PATH)
  find_path(CONNEX_GOOGLEAPIS_PROTO_ROOT google/api/annotations.proto
            PATHS /usr/share/gocode/src/github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis
            NO_DEFAULT_PATH)
  # libsodium: SHA-256 of the per-incarnation credentials that etcd keeps instead of the secrets.
  pkg_check_modules(SODIUM QUIET IMPORTED_TARGET libsodium)
  foreach(need Protobuf_FOUND Protobuf_PROTOC_EXECUTABLE gRPC_FOUND CONNEX_GRPC_CPP_PLUGIN
               CONNEX_ETCD_PROTO_ROOT CONNEX_GOGO_PROTO_ROOT CONNEX_GOOGLEAPIS_PROTO_ROOT SODIUM_FOUND)
    if(NOT ${need})
      list(APPEND connex_etcd_missing ${need})
    endif()
  endforeach()
endif()
connex_resolve_part(CONNEX_ETCD
  "libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev libsodium-dev golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev"
  ${connex_etcd_missing})

set(connex_ucx_missing)
if(CONNEX_UCX)
  pkg_check_modules(UCX QUIET IMPORTED_TARGET ucx)
  if(NOT UCX_FOUND)
    set(connex_ucx_missing ucx)
  endif()
endif()
connex_resolve_part(CONNEX_UCX libucx-dev ${connex_ucx_missing})

# Debian's python3-dev and pybind11-dev, for Debian's /usr/bin/python3 (which has python3-pytest
# and python3-numpy) even when another python3 comes first on PATH; -DPython3_EXECUTABLE=...
# picks another interpreter.
set(connex_python_missing)
if(CONNEX_PYTHON)
  if(NOT Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python of the bindings and their tests")
  endif()
  find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
  if(Python3_FOUND)
    set(PYTHON_EXECUTABLE ${Python3_EXECUTABLE} CACHE FILEPATH "Python for pybind11" FORCE)
    find_package(pybind11 2.10 QUIET CONFIG)
  endif()
  foreach(need Python3_FOUND pybind11_FOUND)
    if(NOT ${need})
      list(APPEND connex_python_missing ${need})
    endif()
  endforeach()
endif()
connex_resolve_part(CONNEX_PYTHON "python3-dev pybind11-dev" ${connex_python_missing})

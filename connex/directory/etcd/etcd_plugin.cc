// The etcd backend as a plugin, libconnex-etcd.so (docs/design/etcd.md, "The plugin"). A program
// that accepts etcd:// without linking gRPC (connex-stage, connex-proxy, connexctl) loads it on
// the first etcd:// address (internal/store.h: LoadStorePlugin). The plugin holds only the etcd
// code (connex_etcd, its generated stubs, connex_directory_etcd); its references to the base and
// directory libraries resolve to the loading program's own copies, which the program exports
// (ENABLE_EXPORTS), so that there is one registry, one logger and one of every global.
#include "connex/directory/etcd/etcd_backend.h"

extern "C" __attribute__((visibility("default"))) void connex_etcd_plugin_register_v1() {
  connex::directory::RegisterEtcdBackend();
}

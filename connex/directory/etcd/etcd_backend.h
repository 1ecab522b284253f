// The etcd backend of DirectoryClient (`etcd://H1:P1,...` addresses; docs/design/etcd.md), in
// its own library (connex_directory_etcd) so that only the programs that accept etcd pay for
// gRPC: such a program links it and calls RegisterEtcdBackend() once before connecting.
#ifndef CONNEX_DIRECTORY_ETCD_ETCD_BACKEND_H_
#define CONNEX_DIRECTORY_ETCD_ETCD_BACKEND_H_

namespace connex::directory {

// Lets DirectoryClient::Connect take `etcd://` addresses. Idempotent and thread-safe.
void RegisterEtcdBackend();

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_ETCD_ETCD_BACKEND_H_

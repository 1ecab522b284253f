// The Python wrappers of the directory's client and server (directory.cc), shared with the
// elastic bindings, which hold the client's C++ object.
#ifndef CONNEX_PYTHON_BINDINGS_DIRECTORY_H_
#define CONNEX_PYTHON_BINDINGS_DIRECTORY_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "connex/directory/client.h"
#include "connex/directory/server.h"
#include "python/bindings/common.h"

namespace connex::python {

// connex.directory.DirectoryClient. Thread-safe as the C++ client is; its Python state (callbacks)
// is guarded by the GIL.
class PyDirectoryClient {
 public:
  PyDirectoryClient(directory::DirectoryClientOptions options, std::optional<Lid> lid,
                    std::vector<std::string> local_addresses);
  ~PyDirectoryClient();

  void Start();
  void Close();
  // The running C++ client; RuntimeError when not started or closed.
  std::shared_ptr<directory::DirectoryClient> Get() const;
  // The LID given at construction; InvalidArgument without one.
  const Lid& OwnLid(const char* what) const;

  uint64_t Subscribe(py::function callback);
  void Unsubscribe(uint64_t id);
  void OnRegistrationChange(py::object callback);

  const directory::DirectoryClientOptions& options() const { return options_; }
  const std::optional<Lid>& lid() const { return lid_; }
  const std::vector<std::string>& local_addresses() const { return local_addresses_; }

 private:
  const directory::DirectoryClientOptions options_;
  const std::optional<Lid> lid_;
  const std::vector<std::string> local_addresses_;
  std::shared_ptr<directory::DirectoryClient> client_;
  bool closed_ = false;
  std::map<uint64_t, CallbackSlotPtr> subscriptions_;
  CallbackSlotPtr registration_slot_;
  const DispatcherPtr dispatcher_ = Dispatcher::Create();
  uint64_t closer_ = 0;
};

// "host:port" -> "tcp://host:port"; an address with a scheme is kept.
std::string WithScheme(const std::string& address);

}  // namespace connex::python

#endif  // CONNEX_PYTHON_BINDINGS_DIRECTORY_H_

// StateFile: the embedded directory's durable state in `--state-dir` — the next epoch (so that an
// epoch never repeats across restarts or clock steps) and the table (so that a restart is
// invisible). Written atomically (temporary file, fdatasync, rename) before any reply or event
// that depends on it goes out; one directory process per state dir (flock).
// Thread-compatible: the server's loop thread owns it.
#ifndef CONNEX_DIRECTORY_STATE_FILE_H_
#define CONNEX_DIRECTORY_STATE_FILE_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "connex/directory/registry.h"

namespace connex::directory {

class StateFile {
 public:
  // Creates `dir` if needed and locks it. FailedPrecondition when another process holds the
  // lock; InvalidArgument when the directory cannot be created or written.
  static absl::StatusOr<std::unique_ptr<StateFile>> Open(const std::string& dir);
  ~StateFile();

  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  // The saved state; nullopt when there is none yet (a first start). DataLoss when the file
  // cannot be decoded: the directory must not start (it could hand out an epoch again).
  absl::StatusOr<std::optional<RegistryState>> Load() const;
  // Replaces the saved state. The file is only readable by its owner (it holds credentials).
  absl::Status Save(const RegistryState& state);

  const std::string& path() const { return path_; }
  uint64_t saves() const { return saves_; }

 private:
  StateFile(std::string dir, int lock_fd);

  std::string dir_;
  std::string path_;
  int lock_fd_ = -1;
  uint64_t saves_ = 0;
};

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_STATE_FILE_H_

// Where a test's directory keeps its state dir: in memory (tmpfs, /dev/shm) when the machine has
// one, else the temp dir. A test's restart is a process's, which a state in /dev/shm survives as
// well as one on disk, and the tests check the directory's protocol, not the disk. On a disk the
// directory answers nobody while it writes and fdatasyncs its state: with the disk busy writing
// back (a build beside `make test`) one write took 539 ms in a cold CI run, 1.5 s under a
// `dd conv=fsync` load, and a restarted directory's members missed their leases
// (docs/development.md).
#ifndef CONNEX_DIRECTORY_TESTING_STATE_DIR_H_
#define CONNEX_DIRECTORY_TESTING_STATE_DIR_H_

#include <filesystem>
#include <string>

namespace connex::directory::testing {

// `name` under the state dirs' base (not created; an older one of that name is not removed).
inline std::string TestStateDir(const std::string& name) {
  const std::filesystem::path base = std::filesystem::is_directory("/dev/shm")
                                         ? std::filesystem::path("/dev/shm")
                                         : std::filesystem::temp_directory_path();
  return (base / name).string();
}

}  // namespace connex::directory::testing

#endif  // CONNEX_DIRECTORY_TESTING_STATE_DIR_H_

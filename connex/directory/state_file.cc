#include "connex/directory/state_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "connex/base/codec.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::directory {
namespace {

constexpr std::string_view kStateType = "DIRECTORY_STATE";

std::string Errno() { return std::strerror(errno); }

absl::Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(StrCat("directory state '", path, "': ", Errno()));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

StateFile::StateFile(std::string dir, int lock_fd)
    : dir_(std::move(dir)), path_(dir_ + "/state"), lock_fd_(lock_fd) {}

StateFile::~StateFile() {
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

absl::StatusOr<std::unique_ptr<StateFile>> StateFile::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        StrCat("--state-dir '", dir, "': cannot create it: ", ec.message()));
  }
  std::string lock = dir + "/lock";
  int fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(StrCat("--state-dir '", dir, "': ", lock, ": ", Errno()));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return absl::FailedPreconditionError(
        StrCat("--state-dir '", dir, "' is in use by another connex-directory"));
  }
  return std::unique_ptr<StateFile>(new StateFile(dir, fd));
}

absl::StatusOr<std::optional<RegistryState>> StateFile::Load() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::optional<RegistryState>();
    return absl::DataLossError(StrCat("directory state '", path_, "': ", Errno()));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string bytes = buffer.str();
  wire::Limits limits;
  limits.max_frame_bytes = size_t{1} << 31;
  absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(bytes, limits);
  if (!frame.ok() || frame->type != kStateType) {
    return absl::DataLossError(
        StrCat("directory state '", path_, "' is corrupt (",
               frame.ok() ? StrCat("type ", frame->type) : std::string(frame.status().message()),
               "); refusing to start, since epochs could repeat (move it away to start afresh)"));
  }
  const wire::MapView& body = frame->body;
  RegistryState state;
  absl::Status ok = [&]() -> absl::Status {
    CONNEX_ASSIGN_OR_RETURN(state.next_epoch, body.Uint("next_epoch"));
    CONNEX_ASSIGN_OR_RETURN(state.revision, body.UintOr("revision", 0));
    if (!body.Has("entries")) return absl::OkStatus();
    CONNEX_ASSIGN_OR_RETURN(wire::ListView entries, body.List("entries"));
    for (size_t i = 0; i < entries.size(); ++i) {
      CONNEX_ASSIGN_OR_RETURN(wire::MapView m, entries.MapAt(i));
      RegistryState::Entry e;
      CONNEX_ASSIGN_OR_RETURN(wire::MapView record, m.Map("record"));
      CONNEX_ASSIGN_OR_RETURN(e.record, DecodeRecord(record));
      CONNEX_ASSIGN_OR_RETURN(e.credential, m.Str("credential"));
      CONNEX_ASSIGN_OR_RETURN(e.previous_epoch, m.UintOr("previous_epoch", 0));
      CONNEX_ASSIGN_OR_RETURN(e.previous_credential, m.StrOr("previous_credential", ""));
      state.entries.push_back(std::move(e));
    }
    return absl::OkStatus();
  }();
  if (!ok.ok()) {
    return absl::DataLossError(StrCat("directory state '", path_, "': ", ok.message()));
  }
  return std::optional<RegistryState>(std::move(state));
}

absl::Status StateFile::Save(const RegistryState& state) {
  wire::ListBuilder entries;
  for (const RegistryState::Entry& e : state.entries) {
    wire::MapBuilder record;
    EncodeRecord(e.record, &record);
    wire::MapBuilder m;
    m.Map("record", record)
        .Str("credential", e.credential)
        .Uint("previous_epoch", e.previous_epoch)
        .Str("previous_credential", e.previous_credential);
    entries.AddMap(m);
  }
  wire::MapBuilder body;
  body.Uint("next_epoch", state.next_epoch)
      .Uint("revision", state.revision)
      .List("entries", entries);
  std::string bytes = wire::EncodeFrame(kStateType, body);
  std::string tmp = path_ + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(StrCat("directory state '", tmp, "': ", Errno()));
  absl::Status written = WriteAll(fd, bytes, tmp);
  if (written.ok() && fdatasync(fd) != 0) {
    written = absl::InternalError(StrCat("directory state '", tmp, "': fdatasync: ", Errno()));
  }
  close(fd);
  CONNEX_RETURN_IF_ERROR(written);
  if (rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(StrCat("directory state '", path_, "': rename: ", Errno()));
  }
  // The rename itself must survive a crash of the machine.
  int dir_fd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  ++saves_;
  return absl::OkStatus();
}

}  // namespace connex::directory

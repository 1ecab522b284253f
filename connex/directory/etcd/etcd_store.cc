// EtcdStore (etcd_store.h): the key layout and the record's value, the process's lease (granted,
// kept alive, revoked on close), the operator's admin token, and snapshots read with one Range.
// The membership transactions — JOIN, the holder's confirmation, LEAVE, REPORT_FAILED — are
// etcd_store_membership.cc; events derived from the watch, event_deriver.cc.
#include "connex/directory/etcd/etcd_store.h"

#include <sodium.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "connex/base/check.h"
#include "connex/base/codec.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/secret.h"

namespace connex::directory::etcd {
namespace {

constexpr std::string_view kRecordFrame = "RECORD";

std::string LidSuffix(const Lid& lid) {
  return StrCat("g", lid.group, "/s", lid.shard, "/r", lid.replica);
}

int64_t CeilSeconds(int64_t ms) { return std::max<int64_t>(1, (ms + 999) / 1000); }

}  // namespace

std::string ModelPrefix(std::string_view model) { return StrCat(kRoot, model, "/"); }
std::string RecordKey(const Lid& lid) {
  return StrCat(ModelPrefix(lid.model), "lid/", LidSuffix(lid));
}
std::string CredentialKey(const Lid& lid) {
  return StrCat(ModelPrefix(lid.model), "cred/", LidSuffix(lid));
}
std::string EndKey(const Lid& lid) {
  return StrCat(ModelPrefix(lid.model), "end/", LidSuffix(lid));
}

absl::StatusOr<ParsedKey> ParseKey(std::string_view key) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(StrCat("etcd key '", key, "' is not a Connex key: ", why));
  };
  if (key.substr(0, kRoot.size()) != kRoot) return bad(StrCat("not under ", kRoot));
  std::string_view rest = key.substr(kRoot.size());
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return bad("no kind after the model");
  std::string_view model = rest.substr(0, slash);
  rest = rest.substr(slash + 1);
  slash = rest.find('/');
  if (slash == std::string_view::npos) return bad("no LID after the kind");
  std::string_view kind = rest.substr(0, slash);
  ParsedKey parsed;
  if (kind == "lid") {
    parsed.kind = ParsedKey::Kind::kRecord;
  } else if (kind == "cred") {
    parsed.kind = ParsedKey::Kind::kCredential;
  } else if (kind == "end") {
    parsed.kind = ParsedKey::Kind::kEnd;
  } else {
    return bad(StrCat("unknown kind '", kind, "' (lid, cred or end)"));
  }
  absl::StatusOr<Lid> lid = Lid::Parse(StrCat(model, "/", rest.substr(slash + 1)));
  if (!lid.ok()) return bad(AsStd(lid.status().message()));
  parsed.lid = *std::move(lid);
  return parsed;
}

std::string EncodeRecordValue(const Record& record) {
  wire::MapBuilder body;
  body.StrList("addresses", record.addresses).StrMap("metadata", record.metadata);
  return wire::EncodeFrame(kRecordFrame, body);
}

absl::StatusOr<Record> DecodeRecordValue(const Lid& lid, std::string_view value) {
  absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(value);
  if (!frame.ok()) return Annotate(frame.status(), StrCat("etcd record of ", lid.ToString()));
  if (frame->type != kRecordFrame) {
    return absl::InvalidArgumentError(StrCat("etcd record of ", lid.ToString(), ": a ", frame->type,
                                             " frame, not ", kRecordFrame));
  }
  Record record;
  record.lid = lid;
  CONNEX_ASSIGN_OR_RETURN(record.addresses, frame->body.StrList("addresses"));
  if (frame->body.Has("metadata")) {
    CONNEX_ASSIGN_OR_RETURN(record.metadata, frame->body.StrMap("metadata"));
  }
  return record;
}

std::string CredentialDigest(std::string_view credential) {
  static const bool sodium_ready = sodium_init() >= 0;
  CONNEX_CHECK(sodium_ready);
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(digest, reinterpret_cast<const unsigned char*>(credential.data()),
                     credential.size());
  return HexOf(digest, sizeof(digest));
}

// ---- EtcdStore ----

EtcdStore::EtcdStore(EtcdClient* client, EtcdStoreOptions options)
    : client_(client), options_(std::move(options)) {
  if (!options_.new_credential) options_.new_credential = NewCredential;
}

absl::StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::Open(EtcdClient* client,
                                                           EtcdStoreOptions options) {
  if (sodium_init() < 0) return absl::InternalError("libsodium failed to initialise");
  if (options.lease_ttl_ms <= 0) {
    return absl::InvalidArgumentError(
        StrCat("lease TTL ", options.lease_ttl_ms, " ms: it must be positive"));
  }
  if (options.end_marker_ttl_ms < options.lease_ttl_ms) {
    return absl::InvalidArgumentError(StrCat("end markers live ", options.end_marker_ttl_ms,
                                             " ms, under the lease TTL of ", options.lease_ttl_ms,
                                             " ms: a watcher would mistake a LEAVE for a FAILED"));
  }
  std::unique_ptr<EtcdStore> store(new EtcdStore(client, std::move(options)));
  CONNEX_RETURN_IF_ERROR(store->GrantLease());
  return store;
}

EtcdStore::~EtcdStore() {
  int64_t lease = 0;
  {
    MutexLock lock(&mu_);
    if (keepalive_) keepalive_->Stop();
    keepalive_.reset();
    lease = lease_id_;
  }
  // Revoking deletes every key of the lease now, rather than after its TTL: the holder is gone.
  absl::Status revoked = client_->LeaseRevoke(lease);
  if (!revoked.ok() && !absl::IsNotFound(revoked)) {
    CONNEX_LOG_WARN("etcd directory: revoking lease {:x} failed ({}); its LIDs go when it expires",
                    lease, revoked.ToString());
  }
}

absl::Status EtcdStore::GrantLease() {
  CONNEX_ASSIGN_OR_RETURN(LeaseGrantResult grant,
                          client_->LeaseGrant(CeilSeconds(options_.lease_ttl_ms)));
  const int64_t ttl_ms = grant.ttl_seconds * 1000;
  // Renew three times a TTL, so that a renewal lost to a member's failure leaves time for another.
  std::unique_ptr<EtcdKeepAlive> keepalive =
      client_->KeepAlive(grant.id, absl::Milliseconds(std::max<int64_t>(ttl_ms / 3, 100)));
  MutexLock lock(&mu_);
  if (keepalive_) keepalive_->Stop();
  keepalive_ = std::move(keepalive);
  if (lease_id_ != 0) previous_leases_.insert(lease_id_);
  lease_id_ = grant.id;
  lease_ttl_ms_ = ttl_ms;
  return absl::OkStatus();
}

absl::Status EtcdStore::RenewLease() {
  // One grant for every caller that found the lease lost at once (the lease keeper's rejoin and a
  // holder's own Renew): a second grant would bind the LIDs the first rejoined to a lease that is
  // no longer kept alive.
  MutexLock renewing(&renew_mu_);
  if (lease_status().ok()) return absl::OkStatus();
  return GrantLease();
}

bool EtcdStore::WasOurLease(int64_t lease) const {
  MutexLock lock(&mu_);
  return previous_leases_.count(lease) > 0;
}

absl::Status EtcdStore::lease_status() const {
  MutexLock lock(&mu_);
  if (!keepalive_) return absl::FailedPreconditionError("the store holds no lease");
  return keepalive_->status();
}

std::optional<int64_t> EtcdStore::lease_renewed_steady_ms() const {
  MutexLock lock(&mu_);
  if (!keepalive_) return std::nullopt;
  return keepalive_->renewed_steady_ms();
}

int64_t EtcdStore::lease_id() const {
  MutexLock lock(&mu_);
  return lease_id_;
}

int64_t EtcdStore::lease_ttl_ms() const {
  MutexLock lock(&mu_);
  return lease_ttl_ms_;
}

void EtcdStore::StopRenewingForTest() {
  MutexLock lock(&mu_);
  if (keepalive_) keepalive_->Stop();
}

absl::StatusOr<int64_t> EtcdStore::MarkerLease() {
  CONNEX_ASSIGN_OR_RETURN(LeaseGrantResult grant,
                          client_->LeaseGrant(CeilSeconds(options_.end_marker_ttl_ms)));
  return grant.id;
}

absl::Status EtcdStore::CheckAdmin(std::string_view token, std::string_view what) const {
  if (options_.admin_token.empty()) {
    return absl::PermissionDeniedError(
        StrCat(what,
               " needs the admin token, and this client has none (CONNEX_DIRECTORY_ADMIN_TOKEN "
               "or CONNEX_DIRECTORY_ADMIN_TOKEN_FILE; on etcd, the writes themselves are "
               "allowed by etcd's own auth)"));
  }
  if (token.empty()) return absl::PermissionDeniedError(StrCat(what, " needs the admin token"));
  if (!SecretsEqual(token, options_.admin_token)) {
    return absl::PermissionDeniedError(StrCat(what, ": wrong admin token"));
  }
  return absl::OkStatus();
}

std::string EtcdStore::LeaseLeft(int64_t lease) {
  absl::StatusOr<LeaseTimeToLiveResult> ttl = client_->LeaseTimeToLive(lease);
  if (!ttl.ok() || ttl->ttl_seconds < 0) return "";
  return StrCat(", about ", ttl->ttl_seconds, " s of its lease left");
}

absl::StatusOr<Snapshot> ReadSnapshot(EtcdClient& client, std::optional<std::string> model,
                                      std::optional<uint32_t> group) {
  std::string prefix = std::string(kRoot);
  if (model) {
    CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(*model));
    prefix = StrCat(ModelPrefix(*model), "lid/");
    if (group) prefix = StrCat(prefix, "g", *group, "/");
  }
  RangeOptions range;
  range.range_end = PrefixEnd(prefix);
  CONNEX_ASSIGN_OR_RETURN(RangeResult read, client.Range(prefix, range));
  Snapshot snapshot;
  snapshot.incarnation = 1;  // etcd keeps the history: there is no restart to tell apart
  snapshot.revision = static_cast<uint64_t>(read.revision);
  snapshot.model_revision = snapshot.revision;
  for (const KeyValue& kv : read.kvs) {
    absl::StatusOr<ParsedKey> parsed = ParseKey(kv.key);
    if (!parsed.ok()) {
      CONNEX_LOG_WARN("etcd directory: skipping a key in the snapshot: {}",
                      parsed.status().ToString());
      continue;
    }
    if (parsed->kind != ParsedKey::Kind::kRecord) continue;
    if (group && parsed->lid.group != *group) continue;
    absl::StatusOr<Record> record = DecodeRecordValue(parsed->lid, kv.value);
    if (!record.ok()) {
      CONNEX_LOG_WARN("etcd directory: skipping a record in the snapshot: {}",
                      record.status().ToString());
      continue;
    }
    record->epoch = static_cast<uint64_t>(kv.mod_revision);
    snapshot.records.push_back(*std::move(record));
  }
  std::sort(snapshot.records.begin(), snapshot.records.end(),
            [](const Record& a, const Record& b) { return a.lid < b.lid; });
  return snapshot;
}

absl::StatusOr<Snapshot> EtcdStore::Snap(std::optional<std::string> model,
                                         std::optional<uint32_t> group) {
  return ReadSnapshot(*client_, std::move(model), group);
}

}  // namespace connex::directory::etcd

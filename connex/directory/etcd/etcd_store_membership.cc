// EtcdStore's membership transactions (the class is etcd_store.h): JOIN (a new holder, a
// migration, the operator's forced takeover), the holder's confirmation of its lease (Confirm),
// LEAVE and REPORT_FAILED, each one etcd transaction over the LID's record, credential and end keys
// (docs/design/etcd.md), read again and retried while another writer changes them in between.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_store.h"
#include "connex/directory/secret.h"

namespace connex::directory::etcd {
namespace {

// A transaction whose comparison failed because the key changed in between is tried again
// with what it read; this many times before the caller is told to retry.
constexpr int kMaxTxnRounds = 8;

// The key and credential of one LID as a transaction's Get ops returned them.
struct Held {
  std::optional<KeyValue> record;
  std::optional<KeyValue> credential;
  std::optional<KeyValue> end;
};

std::optional<KeyValue> FirstKv(const TxnResult& txn, size_t index) {
  if (index >= txn.results.size() || txn.results[index].range.kvs.empty()) return std::nullopt;
  return txn.results[index].range.kvs.front();
}

std::vector<TxnOp> GetsOf(const Lid& lid) {
  return {TxnOp::Get(RecordKey(lid)), TxnOp::Get(CredentialKey(lid)), TxnOp::Get(EndKey(lid))};
}

Held HeldOf(const TxnResult& txn, size_t first = 0) {
  return Held{FirstKv(txn, first), FirstKv(txn, first + 1), FirstKv(txn, first + 2)};
}

bool DigestIs(const std::optional<KeyValue>& credential, std::string_view secret) {
  return credential.has_value() && !secret.empty() &&
         SecretsEqual(credential->value, CredentialDigest(secret));
}

}  // namespace

absl::StatusOr<Registry::JoinResult> EtcdStore::Join(
    const Lid& lid, const std::vector<std::string>& addresses,
    const std::map<std::string, std::string>& metadata, const JoinAuth& auth) {
  CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(lid.model));
  CONNEX_RETURN_IF_ERROR(ValidateRegistration(addresses, metadata));
  Record record;
  record.lid = lid;
  record.addresses = addresses;
  record.metadata = metadata;
  const size_t bytes = RecordBytes(record);
  if (bytes > options_.max_record_bytes) {
    return absl::InvalidArgumentError(
        StrCat("the record takes ", bytes, " bytes, over the limit of ", options_.max_record_bytes,
               " (CONNEX_DIRECTORY_MAX_RECORD_BYTES): shorten its metadata"));
  }
  CONNEX_RETURN_IF_ERROR(Annotate(lease_status(),
                                  "this process's etcd lease is gone (an outage longer than its "
                                  "TTL): RenewLease, then join again"));
  const int64_t lease = lease_id();
  const std::string key = RecordKey(lid);
  const std::string cred_key = CredentialKey(lid);
  const std::string value = EncodeRecordValue(record);
  // This JOIN's credential, made before the transaction, so that a transaction the client
  // retried after it was applied is recognised as ours (its digest is in the credential key).
  const std::string credential = options_.new_credential();
  const std::string digest = CredentialDigest(credential);
  if (auth.force) CONNEX_RETURN_IF_ERROR(CheckAdmin(auth.admin_token, "a forced JOIN"));

  for (int round = 0; round < kMaxTxnRounds; ++round) {
    // A new record, if the LID is free: within the model's limit?
    RangeOptions count;
    count.range_end = PrefixEnd(StrCat(ModelPrefix(lid.model), "lid/"));
    count.count_only = true;
    CONNEX_ASSIGN_OR_RETURN(RangeResult in_model,
                            client_->Range(StrCat(ModelPrefix(lid.model), "lid/"), count));
    // And within the limit of every model together? Each record key has a credential key and
    // maybe an end marker beside it, so half of all the keys bounds the records from above; only
    // near the limit are the records counted one by one.
    RangeOptions all;
    all.range_end = PrefixEnd(kRoot);
    all.count_only = true;
    CONNEX_ASSIGN_OR_RETURN(RangeResult everything, client_->Range(kRoot, all));
    size_t records = 0;
    if (static_cast<size_t>(everything.count) / 2 >= options_.max_records) {
      RangeOptions keys;
      keys.range_end = PrefixEnd(kRoot);
      keys.keys_only = true;
      CONNEX_ASSIGN_OR_RETURN(RangeResult listed, client_->Range(kRoot, keys));
      for (const KeyValue& kv : listed.kvs) {
        absl::StatusOr<ParsedKey> parsed = ParseKey(kv.key);
        if (parsed.ok() && parsed->kind == ParsedKey::Kind::kRecord) ++records;
      }
    }
    const bool table_full = records >= options_.max_records;
    const bool model_full =
        table_full || static_cast<size_t>(in_model.count) >= options_.max_records_per_model;
    Txn create;
    if (!model_full) {
      create.compare = {Compare::Absent(key)};
      create.success = {TxnOp::Put(key, value, lease), TxnOp::Put(cred_key, digest, lease)};
      create.failure = GetsOf(lid);
    } else {
      // Nothing to create: the reads tell whether the LID exists (a migration or a takeover
      // replaces a record) or the model is full.
      create.success = GetsOf(lid);
    }
    CONNEX_ASSIGN_OR_RETURN(TxnResult txn, client_->Transact(create));
    if (!model_full && txn.succeeded) {
      return Registry::JoinResult{static_cast<uint64_t>(txn.revision), credential, true};
    }
    Held held = HeldOf(txn);
    if (table_full && !held.record) {
      return absl::ResourceExhaustedError(StrCat("the directory has ", records,
                                                 " records, its limit (", options_.max_records,
                                                 ", CONNEX_DIRECTORY_MAX_RECORDS)"));
    }
    if (model_full && !held.record) {
      return absl::ResourceExhaustedError(
          StrCat("model '", lid.model, "' has ", in_model.count, " records, its limit (",
                 options_.max_records_per_model, ", CONNEX_DIRECTORY_MAX_RECORDS_PER_MODEL)"));
    }
    if (!held.record) continue;  // gone since: try to create it again
    const KeyValue& current = *held.record;
    if (DigestIs(held.credential, credential)) {
      // An earlier attempt of this very transaction was applied.
      return Registry::JoinResult{static_cast<uint64_t>(current.mod_revision), credential, true};
    }
    if (DigestIs(held.credential, auth.credential)) {
      if (current.value == value && current.lease == lease) {
        // The holder's idempotent retry.
        return Registry::JoinResult{static_cast<uint64_t>(current.mod_revision), auth.credential,
                                    false};
      }
      // Migration: the holder moves; a new incarnation with its own credential.
      Txn migrate;
      migrate.compare = {Compare::ModRevision(key, Compare::Result::kEqual, current.mod_revision),
                         Compare::Value(cred_key, Compare::Result::kEqual, held.credential->value)};
      migrate.success = {TxnOp::Put(key, value, lease), TxnOp::Put(cred_key, digest, lease)};
      migrate.failure = GetsOf(lid);
      CONNEX_ASSIGN_OR_RETURN(TxnResult moved, client_->Transact(migrate));
      if (moved.succeeded) {
        return Registry::JoinResult{static_cast<uint64_t>(moved.revision), credential, true};
      }
      Held now = HeldOf(moved);
      if (now.record && DigestIs(now.credential, credential)) {
        return Registry::JoinResult{static_cast<uint64_t>(now.record->mod_revision), credential,
                                    true};
      }
      continue;  // changed in between (an eviction, a takeover): look again
    }
    const uint64_t epoch = static_cast<uint64_t>(current.mod_revision);
    if (auth.force) {
      // The operator takes the LID over; the holder is fenced (FAILED superseded).
      CONNEX_ASSIGN_OR_RETURN(int64_t marker, MarkerLease());
      Txn take;
      take.compare = {Compare::ModRevision(key, Compare::Result::kEqual, current.mod_revision)};
      take.success = {
          TxnOp::Put(EndKey(lid), StrCat(kEndSupersededPrefix, " epoch ", epoch), marker),
          TxnOp::Put(key, value, lease), TxnOp::Put(cred_key, digest, lease)};
      take.failure = GetsOf(lid);
      CONNEX_ASSIGN_OR_RETURN(TxnResult taken, client_->Transact(take));
      if (taken.succeeded) {
        CONNEX_LOG_INFO("etcd directory: {} epoch {} taken over by the operator (epoch {})",
                        lid.ToString(), epoch, taken.revision);
        return Registry::JoinResult{static_cast<uint64_t>(taken.revision), credential, true};
      }
      Held now = HeldOf(taken);
      if (now.record && DigestIs(now.credential, credential)) {
        return Registry::JoinResult{static_cast<uint64_t>(now.record->mod_revision), credential,
                                    true};
      }
      continue;
    }
    if (auth.exclusive) {
      return absl::FailedPreconditionError(StrCat("held by another process (epoch ", epoch, ")"));
    }
    return absl::AlreadyExistsError(StrCat("held by epoch ", epoch, " (lease live",
                                           LeaseLeft(current.lease),
                                           "; only its holder may change it, or an operator "
                                           "with `connexctl join --force`)"));
  }
  return absl::UnavailableError(StrCat("JOIN of ", lid.ToString(), ": the record changed ",
                                       kMaxTxnRounds, " times while joining; try again"));
}

absl::Status EtcdStore::Confirm(const Lid& lid, uint64_t epoch) {
  Txn read;
  read.success = GetsOf(lid);
  CONNEX_ASSIGN_OR_RETURN(TxnResult txn, client_->Transact(read));
  Held held = HeldOf(txn);
  if (!held.record) {
    // The end marker written with this epoch's end (not an older one's) says how it ended.
    const bool marked = held.end && static_cast<uint64_t>(held.end->mod_revision) > epoch;
    if (marked && held.end->value == kEndLeft) {
      return EndedByLeaveError(StrCat("epoch ", epoch, " of ", lid.ToString(),
                                      " is over: it left (drained or its own LEAVE)"));
    }
    return absl::NotFoundError(StrCat("epoch ", epoch, " of ", lid.ToString(),
                                      " was evicted and nobody holds the LID (",
                                      marked ? held.end->value : "its lease expired", ")"));
  }
  if (static_cast<uint64_t>(held.record->mod_revision) != epoch) {
    return absl::FailedPreconditionError(StrCat("epoch ", epoch, " of ", lid.ToString(),
                                                " is superseded by ", held.record->mod_revision));
  }
  if (held.record->lease != lease_id()) {
    if (WasOurLease(held.record->lease)) {
      // Ours, on the lease this process held before an outage made it grant a new one: join
      // again (the holder's credential moves the record to the current lease).
      return absl::NotFoundError(StrCat("epoch ", epoch, " of ", lid.ToString(),
                                        " is bound to this process's previous etcd lease"));
    }
    return absl::FailedPreconditionError(
        StrCat("epoch ", epoch, " of ", lid.ToString(), " is bound to another process's lease"));
  }
  return absl::OkStatus();
}

absl::Status EtcdStore::Leave(const Lid& lid, uint64_t epoch, const Caller& caller) {
  for (int round = 0; round < kMaxTxnRounds; ++round) {
    Txn read;
    read.success = GetsOf(lid);
    CONNEX_ASSIGN_OR_RETURN(TxnResult txn, client_->Transact(read));
    Held held = HeldOf(txn);
    if (!held.record) return absl::NotFoundError(StrCat(lid.ToString(), " is not registered"));
    const uint64_t current = static_cast<uint64_t>(held.record->mod_revision);
    if (epoch != 0 && current != epoch) {
      return absl::FailedPreconditionError(
          StrCat("epoch ", epoch, " of ", lid.ToString(), " is superseded by ", current));
    }
    if (!DigestIs(held.credential, caller.credential)) {
      if (caller.admin_token.empty()) {
        return absl::PermissionDeniedError(
            caller.credential.empty()
                ? "needs the holder's credential (or the admin token, for an operator's drain)"
                : StrCat("the credential is not that of epoch ", current));
      }
      CONNEX_RETURN_IF_ERROR(CheckAdmin(caller.admin_token, "a drain of another's LID"));
    }
    CONNEX_ASSIGN_OR_RETURN(int64_t marker, MarkerLease());
    Txn leave;
    leave.compare = {
        Compare::ModRevision(RecordKey(lid), Compare::Result::kEqual, held.record->mod_revision)};
    leave.success = {TxnOp::Put(EndKey(lid), std::string(kEndLeft), marker),
                     TxnOp::Delete(RecordKey(lid)), TxnOp::Delete(CredentialKey(lid))};
    leave.failure = GetsOf(lid);
    CONNEX_ASSIGN_OR_RETURN(TxnResult left, client_->Transact(leave));
    if (left.succeeded) return absl::OkStatus();
    Held now = HeldOf(left);
    // Gone, with our marker: an attempt of this transaction that the client retried was applied.
    if (!now.record && now.end && now.end->value == kEndLeft && now.end->lease == marker) {
      return absl::OkStatus();
    }
  }
  return absl::UnavailableError(StrCat("LEAVE of ", lid.ToString(), ": the record changed ",
                                       kMaxTxnRounds, " times while leaving; try again"));
}

absl::StatusOr<bool> EtcdStore::ReportFailed(const Lid& lid, uint64_t epoch, const Caller& caller) {
  // Who reports: a live member of the same model (checked inside the transaction: its
  // credential key must hold the digest of the credential it presents), or the operator.
  const bool as_member =
      caller.member && caller.member->model == lid.model && !caller.member_credential.empty();
  std::string who;
  if (as_member) {
    who = caller.member->ToString();
  } else if (!caller.admin_token.empty()) {
    CONNEX_RETURN_IF_ERROR(CheckAdmin(caller.admin_token, "a report from outside the model"));
    who = "the operator";
  } else {
    return absl::PermissionDeniedError(StrCat(
        "accepted only from a live member of model '", lid.model,
        "' (the credential of a LID it holds) or with the admin token; reporter '", caller.name,
        "'",
        caller.member ? StrCat(" presented ", caller.member->ToString(), ", not of the model")
                      : StrCat(" holds no LID")));
  }
  const std::string name =
      caller.name.empty() || (caller.member && caller.name == caller.member->ToString())
          ? ""
          : StrCat(" (", caller.name, ")");
  for (int round = 0; round < kMaxTxnRounds; ++round) {
    Txn read;
    read.success = GetsOf(lid);
    CONNEX_ASSIGN_OR_RETURN(TxnResult txn, client_->Transact(read));
    Held held = HeldOf(txn);
    if (!held.record) return absl::NotFoundError(StrCat(lid.ToString(), " is not registered"));
    const uint64_t current = static_cast<uint64_t>(held.record->mod_revision);
    if (epoch != 0 && current != epoch) return false;
    CONNEX_ASSIGN_OR_RETURN(int64_t marker, MarkerLease());
    const std::string reason = StrCat(kEndReportedPrefix, " by ", who, name);
    Txn report;
    report.compare = {
        Compare::ModRevision(RecordKey(lid), Compare::Result::kEqual, held.record->mod_revision)};
    if (as_member) {
      report.compare.push_back(Compare::Value(CredentialKey(*caller.member),
                                              Compare::Result::kEqual,
                                              CredentialDigest(caller.member_credential)));
    }
    report.success = {TxnOp::Put(EndKey(lid), reason, marker), TxnOp::Delete(RecordKey(lid)),
                      TxnOp::Delete(CredentialKey(lid))};
    report.failure = GetsOf(lid);
    if (as_member) report.failure.push_back(TxnOp::Get(CredentialKey(*caller.member)));
    CONNEX_ASSIGN_OR_RETURN(TxnResult reported, client_->Transact(report));
    if (reported.succeeded) {
      CONNEX_LOG_WARN("etcd directory: {} epoch {} reported failed by {}{}", lid.ToString(),
                      current, who, name);
      return true;
    }
    Held now = HeldOf(reported);
    if (!now.record && now.end && now.end->value == reason && now.end->lease == marker) {
      return true;  // an attempt the client retried was applied
    }
    if (as_member && !DigestIs(FirstKv(reported, 3), caller.member_credential)) {
      return absl::PermissionDeniedError(StrCat("accepted only from a live member of model '",
                                                lid.model, "'; reporter '", caller.name,
                                                "' presented ", caller.member->ToString(),
                                                ", not a live LID of the model that it holds"));
    }
    if (!now.record) return false;  // gone meanwhile (expired, left, reported by another)
  }
  return absl::UnavailableError(StrCat("REPORT_FAILED of ", lid.ToString(), ": the record changed ",
                                       kMaxTxnRounds, " times while reporting; try again"));
}

}  // namespace connex::directory::etcd

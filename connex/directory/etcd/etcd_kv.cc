// EtcdClient's KV calls (the class is internal/etcd_client_impl.h): Range, Put, DeleteRange, Txn
// and Compact, each one Call over the members, and the conversions between our records
// (etcd_client.h: KeyValue, Compare, TxnOp and the results) and etcd's protobuf messages.
#include <string>
#include <utility>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/internal/etcd_client_impl.h"

namespace connex::directory::etcd {
namespace client_internal {

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

namespace {

using client_internal::FromProto;  // beside the overloads below

RangeResult FromProto(const pb::RangeResponse& response) {
  RangeResult out;
  out.revision = response.header().revision();
  out.kvs.reserve(response.kvs_size());
  for (const auto& kv : response.kvs()) out.kvs.push_back(FromProto(kv));
  out.more = response.more();
  out.count = response.count();
  return out;
}

PutResult FromProto(const pb::PutResponse& response) {
  PutResult out;
  out.revision = response.header().revision();
  if (response.has_prev_kv()) out.prev_kv = FromProto(response.prev_kv());
  return out;
}

DeleteResult FromProto(const pb::DeleteRangeResponse& response) {
  DeleteResult out;
  out.revision = response.header().revision();
  out.deleted = response.deleted();
  for (const auto& kv : response.prev_kvs()) out.prev_kvs.push_back(FromProto(kv));
  return out;
}

void ToProto(std::string_view key, const RangeOptions& options, pb::RangeRequest* request) {
  request->set_key(std::string(key));
  request->set_range_end(options.range_end);
  request->set_limit(options.limit);
  request->set_revision(options.revision);
  request->set_serializable(options.serializable);
  request->set_keys_only(options.keys_only);
  request->set_count_only(options.count_only);
}

void ToProto(const Compare& compare, pb::Compare* out) {
  out->set_key(compare.key);
  switch (compare.result) {
    case Compare::Result::kEqual:
      out->set_result(pb::Compare::EQUAL);
      break;
    case Compare::Result::kGreater:
      out->set_result(pb::Compare::GREATER);
      break;
    case Compare::Result::kLess:
      out->set_result(pb::Compare::LESS);
      break;
    case Compare::Result::kNotEqual:
      out->set_result(pb::Compare::NOT_EQUAL);
      break;
  }
  switch (compare.target) {
    case Compare::Target::kVersion:
      out->set_target(pb::Compare::VERSION);
      out->set_version(compare.number);
      break;
    case Compare::Target::kCreateRevision:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(compare.number);
      break;
    case Compare::Target::kModRevision:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(compare.number);
      break;
    case Compare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(compare.value);
      break;
    case Compare::Target::kLease:
      out->set_target(pb::Compare::LEASE);
      out->set_lease(compare.number);
      break;
  }
}

void ToProto(const TxnOp& op, pb::RequestOp* out) {
  switch (op.kind) {
    case TxnOp::Kind::kRange: {
      auto* range = out->mutable_request_range();
      range->set_key(op.key);
      range->set_range_end(op.range_end);
      break;
    }
    case TxnOp::Kind::kPut: {
      auto* put = out->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      put->set_prev_kv(op.prev_kv);
      break;
    }
    case TxnOp::Kind::kDelete: {
      auto* del = out->mutable_request_delete_range();
      del->set_key(op.key);
      del->set_range_end(op.range_end);
      del->set_prev_kv(op.prev_kv);
      break;
    }
  }
}

}  // namespace

absl::StatusOr<RangeResult> EtcdClientImpl::Range(std::string_view key,
                                                  const RangeOptions& options) {
  pb::RangeRequest request;
  ToProto(key, options, &request);
  pb::RangeResponse response;
  CONNEX_RETURN_IF_ERROR(Call("Range", [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Range(context, request, &response);
  }));
  return FromProto(response);
}

absl::StatusOr<PutResult> EtcdClientImpl::Put(std::string_view key, std::string_view value,
                                              int64_t lease, bool prev_kv) {
  pb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  request.set_prev_kv(prev_kv);
  pb::PutResponse response;
  CONNEX_RETURN_IF_ERROR(Call("Put", [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Put(context, request, &response);
  }));
  return FromProto(response);
}

absl::StatusOr<DeleteResult> EtcdClientImpl::DeleteRange(std::string_view key,
                                                         std::string_view range_end, bool prev_kv) {
  pb::DeleteRangeRequest request;
  request.set_key(std::string(key));
  request.set_range_end(std::string(range_end));
  request.set_prev_kv(prev_kv);
  pb::DeleteRangeResponse response;
  CONNEX_RETURN_IF_ERROR(Call("DeleteRange", [&](Member& member, grpc::ClientContext* context) {
    return member.kv->DeleteRange(context, request, &response);
  }));
  return FromProto(response);
}

absl::StatusOr<TxnResult> EtcdClientImpl::Transact(const Txn& txn) {
  pb::TxnRequest request;
  for (const Compare& compare : txn.compare) ToProto(compare, request.add_compare());
  for (const TxnOp& op : txn.success) ToProto(op, request.add_success());
  for (const TxnOp& op : txn.failure) ToProto(op, request.add_failure());
  pb::TxnResponse response;
  CONNEX_RETURN_IF_ERROR(Call("Txn", [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Txn(context, request, &response);
  }));
  TxnResult out;
  out.succeeded = response.succeeded();
  out.revision = response.header().revision();
  for (const pb::ResponseOp& op : response.responses()) {
    TxnOpResult result;
    switch (op.response_case()) {
      case pb::ResponseOp::kResponseRange:
        result.kind = TxnOp::Kind::kRange;
        result.range = FromProto(op.response_range());
        break;
      case pb::ResponseOp::kResponsePut:
        result.kind = TxnOp::Kind::kPut;
        result.put = FromProto(op.response_put());
        break;
      case pb::ResponseOp::kResponseDeleteRange:
        result.kind = TxnOp::Kind::kDelete;
        result.del = FromProto(op.response_delete_range());
        break;
      default:
        // We send no nested transactions, so a member that answers one is broken.
        return absl::DataLossError(StrCat("etcd: Txn: a response of kind ",
                                          static_cast<int>(op.response_case()),
                                          " to a transaction without nested transactions"));
    }
    out.results.push_back(std::move(result));
  }
  return out;
}

absl::Status EtcdClientImpl::Compact(int64_t revision) {
  pb::CompactionRequest request;
  request.set_revision(revision);
  pb::CompactionResponse response;
  return Call("Compact", [&](Member& member, grpc::ClientContext* context) {
    return member.kv->Compact(context, request, &response);
  });
}

}  // namespace client_internal

Compare Compare::Version(std::string key, Result result, int64_t version) {
  return Compare{std::move(key), Target::kVersion, result, version, {}};
}
Compare Compare::CreateRevision(std::string key, Result result, int64_t revision) {
  return Compare{std::move(key), Target::kCreateRevision, result, revision, {}};
}
Compare Compare::ModRevision(std::string key, Result result, int64_t revision) {
  return Compare{std::move(key), Target::kModRevision, result, revision, {}};
}
Compare Compare::Value(std::string key, Result result, std::string value) {
  return Compare{std::move(key), Target::kValue, result, 0, std::move(value)};
}
Compare Compare::Lease(std::string key, Result result, int64_t lease) {
  return Compare{std::move(key), Target::kLease, result, lease, {}};
}

TxnOp TxnOp::Get(std::string key, std::string range_end) {
  TxnOp op;
  op.kind = Kind::kRange;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}
TxnOp TxnOp::Put(std::string key, std::string value, int64_t lease) {
  TxnOp op;
  op.kind = Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}
TxnOp TxnOp::Delete(std::string key, std::string range_end) {
  TxnOp op;
  op.kind = Kind::kDelete;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}

}  // namespace connex::directory::etcd

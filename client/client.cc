// Client connection, registration (spec, then page-aligned values) and the
// unary calls.
#include <algorithm>
#include <cmath>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client_impl.h"
#include "client/transport/wire/step_wire.h"

namespace optstate {
namespace {

// The least max_message_bytes: one float32 page of the daemon's default
// size (262,144 elements) and room for the other fields.
constexpr int kMinMessageBytes = (1 << 20) + 4096;

}  // namespace

namespace client_internal {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

bool IsRetryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

absl::Duration Backoff(const ClientOptions& options, int attempt) {
  absl::Duration wait = options.initial_backoff;
  for (int i = 1; i < attempt && wait < options.max_backoff; ++i) wait *= 2;
  return std::min(wait, options.max_backoff);
}

void SetDeadline(grpc::ClientContext* context, const ClientOptions& options) {
  // A timeout of a century or more (InfiniteDuration included) is no
  // deadline; added to the clock it could overflow into one in the past.
  if (options.attempt_timeout >= absl::Hours(24 * 365 * 100)) return;
  context->set_deadline(absl::ToChronoTime(absl::Now() + options.attempt_timeout));
}

}  // namespace client_internal

using client_internal::Backoff;
using client_internal::FromGrpcStatus;
using client_internal::GroupInfoFromProto;
using client_internal::IsRetryable;
using client_internal::SetDeadline;

void Client::Impl::Remember(const GroupInfo& info) {
  absl::MutexLock lock(&mu);
  groups[info.name] = info;
}

void Client::Impl::Forget(const std::string& name) {
  absl::MutexLock lock(&mu);
  groups.erase(name);
}

absl::StatusOr<GroupInfo> Client::Impl::Layout(Client& client, const std::string& name) {
  {
    absl::MutexLock lock(&mu);
    if (auto it = groups.find(name); it != groups.end()) return it->second;
  }
  absl::StatusOr<GroupInfo> info = client.DescribeGroup(name);
  if (info.ok()) Remember(*info);
  return info;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        const ClientOptions& options) {
  if (options.max_attempts < 1 || options.max_chunks_in_flight < 1 || options.chunk_bytes == 0 ||
      options.max_message_bytes < kMinMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions: max_attempts and max_chunks_in_flight must be >= 1, chunk_bytes > 0, "
        "max_message_bytes >= ",
        kMinMessageBytes,
        " (one float32 page of the daemon's default size and room for the other fields)"));
  }
  if (options.attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions.attempt_timeout must be positive (absl::InfiniteDuration() for none)");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // Each Client gets its own connection: clients of one process (one per
  // data-parallel rank, say) do not queue behind each other on one socket.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  impl->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  impl->stub = v1::OptimizerState::NewStub(impl->channel);
  impl->raw_step = std::make_unique<grpc::internal::RpcMethod>(
      client_internal::kStepMethod, grpc::internal::RpcMethod::BIDI_STREAMING, impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

namespace {

// One RegisterGroup call: the spec, then (when `values` is set) every chunk
// of initial values for pages that still await them.
absl::StatusOr<v1::RegisterGroupResponse> RegisterOnce(v1::OptimizerState::Stub& stub,
                                                       const ClientOptions& options,
                                                       const v1::GroupSpec& spec,
                                                       absl::Span<const float> values,
                                                       uint64_t page_elements) {
  grpc::ClientContext context;
  SetDeadline(&context, options);
  v1::RegisterGroupResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::RegisterGroupRequest>> writer =
      stub.RegisterGroup(&context, &response);
  v1::RegisterGroupRequest request;
  *request.mutable_spec() = spec;
  bool ok = writer->Write(request);
  if (ok && !values.empty()) {
    const uint64_t page_bytes = page_elements * sizeof(float);
    const uint64_t max_pages = std::max<uint64_t>(
        1, (static_cast<uint64_t>(options.max_message_bytes) - 4096) / page_bytes);
    const uint64_t pages_per_chunk =
        std::clamp<uint64_t>(options.chunk_bytes / page_bytes, 1, max_pages);
    const uint64_t chunk = pages_per_chunk * page_elements;
    for (uint64_t offset = 0; ok && offset < values.size(); offset += chunk) {
      const uint64_t count = std::min<uint64_t>(chunk, values.size() - offset);
      request.Clear();
      v1::ValuesChunk* v = request.mutable_values();
      v->set_offset(offset);
      v->set_dtype(v1::DTYPE_FLOAT32);
      v->set_data(values.data() + offset, count * sizeof(float));
      ok = writer->Write(request);
    }
  }
  writer->WritesDone();
  absl::Status status = FromGrpcStatus(writer->Finish());
  if (!status.ok()) return status;
  return response;
}

}  // namespace

namespace {

v1::GroupSpec MakeSpec(const std::string& name, uint64_t num_elements, const Hyperparameters& h,
                       bool has_initial_values) {
  v1::GroupSpec spec;
  spec.set_name(name);
  spec.set_num_elements(num_elements);
  spec.set_has_initial_values(has_initial_values);
  v1::AdamWHyperparameters* hp = spec.mutable_hyperparameters();
  hp->set_lr(h.lr);
  hp->set_beta1(h.beta1);
  hp->set_beta2(h.beta2);
  hp->set_eps(h.eps);
  hp->set_weight_decay(h.weight_decay);
  return spec;
}

}  // namespace

absl::StatusOr<GroupInfo> Client::Impl::Register(const v1::GroupSpec& spec,
                                                 absl::Span<const float> initial_values) {
  absl::Status last;
  bool created = false;  // By any attempt: a retry finds the group existing.
  for (int attempt = 0; attempt < options.max_attempts; ++attempt) {
    if (attempt > 0) absl::SleepFor(Backoff(options, attempt));
    // The spec alone first: it tells the page size and whether values are due.
    absl::StatusOr<v1::RegisterGroupResponse> first = RegisterOnce(*stub, options, spec, {}, 0);
    if (first.ok()) created |= first->created();
    if (first.ok() && first->group().pages_awaiting_values() > 0) {
      absl::StatusOr<v1::RegisterGroupResponse> filled =
          RegisterOnce(*stub, options, spec, initial_values, first->group().page_elements());
      first = std::move(filled);
    }
    if (first.ok()) {
      absl::StatusOr<GroupInfo> info = GroupInfoFromProto(first->group());
      if (!info.ok()) return info.status();
      info->created = created;
      Remember(*info);
      return info;
    }
    last = first.status();
    if (!IsRetryable(last)) break;
  }
  return last;
}

absl::StatusOr<GroupInfo> Client::RegisterGroup(const std::string& name,
                                                absl::Span<const float> initial_values,
                                                const Hyperparameters& h) {
  if (initial_values.empty()) {
    return absl::InvalidArgumentError("RegisterGroup needs at least one initial value");
  }
  for (size_t i = 0; i < initial_values.size(); ++i) {
    if (!std::isfinite(initial_values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("initial value ", i, " of group '", name, "' is not finite"));
    }
  }
  return impl_->Register(MakeSpec(name, initial_values.size(), h, true), initial_values);
}

absl::StatusOr<GroupInfo> Client::RegisterGroup(const std::string& name, uint64_t num_elements,
                                                const Hyperparameters& h) {
  return impl_->Register(MakeSpec(name, num_elements, h, false), {});
}

namespace {

// A read-only unary call, attempted up to options.max_attempts times while
// it fails transiently (safe: it changes nothing). `call(context)` makes one
// attempt.
absl::Status WithRetries(const ClientOptions& options,
                         absl::FunctionRef<grpc::Status(grpc::ClientContext*)> call) {
  absl::Status last;
  for (int attempt = 0; attempt < options.max_attempts; ++attempt) {
    if (attempt > 0) absl::SleepFor(Backoff(options, attempt));
    grpc::ClientContext context;
    SetDeadline(&context, options);
    last = FromGrpcStatus(call(&context));
    if (last.ok() || !IsRetryable(last)) return last;
  }
  return last;
}

}  // namespace

absl::StatusOr<GroupInfo> Client::DescribeGroup(const std::string& name) {
  v1::DescribeGroupRequest request;
  request.set_name(name);
  v1::DescribeGroupResponse response;
  absl::Status status = WithRetries(impl_->options, [&](grpc::ClientContext* context) {
    return impl_->stub->DescribeGroup(context, request, &response);
  });
  if (!status.ok()) return status;
  return GroupInfoFromProto(response.group().info());
}

absl::StatusOr<std::vector<GroupInfo>> Client::ListGroups() {
  // Page by page (each retried on its own) until the daemon says none is left.
  std::vector<GroupInfo> out;
  v1::ListGroupsRequest request;
  do {
    v1::ListGroupsResponse response;
    absl::Status status = WithRetries(impl_->options, [&](grpc::ClientContext* context) {
      return impl_->stub->ListGroups(context, request, &response);
    });
    if (!status.ok()) return status;
    for (const auto& g : response.groups()) {
      absl::StatusOr<GroupInfo> info = GroupInfoFromProto(g);
      if (!info.ok()) return info.status();
      out.push_back(*std::move(info));
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return out;
}

absl::StatusOr<Stats> Client::GetStats() {
  // Page by page (each retried on its own): the totals as the first page
  // gives them, then every page's groups.
  std::optional<Stats> out;
  v1::GetStatsRequest request;
  do {
    v1::GetStatsResponse response;
    absl::Status status = WithRetries(impl_->options, [&](grpc::ClientContext* context) {
      return impl_->stub->GetStats(context, request, &response);
    });
    if (!status.ok()) return status;
    absl::StatusOr<Stats> page = client_internal::StatsFromProto(response);
    if (!page.ok()) return page.status();
    if (!out.has_value()) {
      out = *std::move(page);
    } else {
      for (GroupStats& g : page->groups) out->groups.push_back(std::move(g));
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return *std::move(out);
}

absl::Status Client::DeleteGroup(const std::string& name) {
  grpc::ClientContext context;
  SetDeadline(&context, impl_->options);
  v1::DeleteGroupRequest request;
  request.set_name(name);
  v1::DeleteGroupResponse response;
  impl_->Forget(name);
  return FromGrpcStatus(impl_->stub->DeleteGroup(&context, request, &response));
}

}  // namespace optstate

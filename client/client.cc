// Client connection, registration (spec, then page-aligned values) and the
// unary calls.
#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/call/channel.h"
#include "client/call/proto_convert.h"
#include "client/call/retry.h"
#include "client/call/status.h"
#include "client/call/tls_diagnosis.h"
#include "client/client_impl.h"
#include "client/transport/step_stream.h"
#include "optstate/message_limits.h"

namespace optstate {

using client_internal::FromGrpcStatus;
using client_internal::GroupInfoFromProto;
using client_internal::PrepareContext;
using client_internal::UnaryWithRetries;
using client_internal::WithRetries;

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

absl::Status Client::Impl::Explain(absl::Status status) const {
  if (status.ok()) return status;
  return client_internal::ExplainCertificateFailure(std::move(status), target, options);
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        const ClientOptions& options) {
  if (absl::Status s = client_internal::CheckClientOptions(options); !s.ok()) return s;
  if (target.empty()) {
    return absl::InvalidArgumentError(
        "the target is empty: give the daemon's address as host:port (or unix:/path)");
  }
  if (absl::StartsWith(target, "http://") || absl::StartsWith(target, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target '", target,
        "' has an http scheme: give the daemon's address as host:port (gRPC speaks HTTP/2 "
        "itself; for TLS set ClientOptions.tls or the TLS files)"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  absl::StatusOr<std::string> token = client_internal::ResolveToken(options);
  if (!token.ok()) return token.status();
  impl->options.token = *std::move(token);
  impl->target = target;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      client_internal::MakeChannel(target, impl->options);
  if (!channel.ok()) return channel.status();
  impl->channel = std::move(*channel);
  impl->stub = v1::OptimizerState::NewStub(impl->channel);
  impl->raw_step = client_internal::MakeStepMethod(impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::Status Client::WaitUntilReachable(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (impl_->several) {
    for (const auto& m : impl_->MembersNow()) {
      // Within what is left of `timeout`, not `timeout` a member.
      const absl::Duration left = std::max(absl::ZeroDuration(), deadline - absl::Now());
      if (absl::Status s = m->shared->WaitUntilReachable(left); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("daemon '", m->target.identity, "' (",
                                                   m->target.target, "): ", s.message()));
      }
    }
    // Reachable: one daemon listed twice is refused now, before any step
    // (each asked once, within what is left of `timeout`; one that does not
    // answer in time is passed over).
    const client_internal::MemberList members = impl_->MembersNow();
    return Impl::CheckOneDaemonEach(members, Impl::InstanceIdsOf(members, deadline), false);
  }
  switch (client_internal::WaitInterruptibly(impl_->options, impl_->channel.get(), deadline)) {
    case client_internal::WaitEnd::kConnected:
      return absl::OkStatus();
    case client_internal::WaitEnd::kInterrupted:
      return absl::CancelledError(
          absl::StrCat("interrupted while waiting for ", impl_->target, " to be reachable"));
    case client_internal::WaitEnd::kDeadline:
      break;
  }
  // The channel's state says nothing of why: one call (which fails at once
  // on a channel that cannot connect) gets gRPC's reason, and Explain adds
  // what a TLS failure means (a plaintext client of a TLS daemon, a wrong
  // root CA, a client certificate missing).
  absl::Status reason;
  {
    grpc::ClientContext context;
    PrepareContext(&context, impl_->options);
    context.set_wait_for_ready(false);  // The reason, not another wait.
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v1::GetStatsRequest request;
    request.set_page_size(1);
    v1::GetStatsResponse response;
    reason = impl_->Explain(FromGrpcStatus(impl_->stub->GetStats(&context, request, &response)));
  }
  if (reason.ok()) return absl::OkStatus();  // Connected meanwhile.
  const bool told = !reason.ok() && reason.code() != absl::StatusCode::kDeadlineExceeded;
  return absl::UnavailableError(
      absl::StrCat("could not connect to the daemon within ", absl::FormatDuration(timeout),
                   told ? absl::StrCat(": ", reason.message())
                        : " (is optstated running there, and is this its address and port?)"));
}

namespace {

// One RegisterGroup call: the spec, then (when `values` is set) every chunk
// of initial values; the daemon takes them only for pages still awaiting
// values, so a retry never rewinds a trained page.
absl::StatusOr<v1::RegisterGroupResponse> RegisterOnce(v1::OptimizerState::Stub& stub,
                                                       const ClientOptions& options,
                                                       const v1::GroupSpec& spec,
                                                       absl::Span<const float> values,
                                                       uint64_t page_elements) {
  grpc::ClientContext context;
  PrepareContext(&context, options);
  v1::RegisterGroupResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::RegisterGroupRequest>> writer =
      stub.RegisterGroup(&context, &response);
  v1::RegisterGroupRequest request;
  *request.mutable_spec() = spec;
  bool ok = writer->Write(request);
  if (ok && !values.empty()) {
    const uint64_t page_bytes = page_elements * sizeof(float);
    const uint64_t max_pages = std::max<uint64_t>(
        1,
        (static_cast<uint64_t>(options.max_message_bytes) - kMessageFieldRoomBytes) / page_bytes);
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
  client_internal::HyperparametersToProto(h, spec.mutable_hyperparameters());
  return spec;
}

}  // namespace

absl::StatusOr<GroupInfo> Client::Impl::Register(const v1::GroupSpec& spec,
                                                 absl::Span<const float> initial_values) {
  bool created = false;  // By any attempt: a retry finds the group existing.
  absl::StatusOr<GroupInfo> info;
  absl::Status status = WithRetries(options, channel.get(), [&](int) -> absl::Status {
    // The spec alone first: it tells the page size and whether values are due.
    absl::StatusOr<v1::RegisterGroupResponse> first = RegisterOnce(*stub, options, spec, {}, 0);
    if (first.ok()) created |= first->created();
    if (first.ok() && first->group().pages_awaiting_values() > 0) {
      first = RegisterOnce(*stub, options, spec, initial_values, first->group().page_elements());
    }
    if (!first.ok()) return first.status();
    info = GroupInfoFromProto(first->group());
    return absl::OkStatus();
  });
  if (!status.ok()) return Explain(status);
  if (!info.ok()) return info.status();
  info->created = created;
  Remember(*info);
  return info;
}

absl::StatusOr<GroupInfo> Client::RegisterGroup(const std::string& name,
                                                absl::Span<const float> initial_values,
                                                const Hyperparameters& h) {
  if (Client* owner = OwnerClient(name)) {
    absl::StatusOr<GroupInfo> info = owner->RegisterGroup(name, initial_values, h);
    if (!info.ok()) return InOwner(name, info.status());
    info->member = MemberOf(name);
    return info;
  }
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
  if (Client* owner = OwnerClient(name)) {
    absl::StatusOr<GroupInfo> info = owner->RegisterGroup(name, num_elements, h);
    if (!info.ok()) return InOwner(name, info.status());
    info->member = MemberOf(name);
    return info;
  }
  return impl_->Register(MakeSpec(name, num_elements, h, false), {});
}

absl::StatusOr<GroupInfo> Client::DescribeGroup(const std::string& name,
                                                const std::optional<std::string>& tenant) {
  if (Client* owner = OwnerClient(name)) {
    absl::StatusOr<GroupInfo> info = owner->DescribeGroup(name, tenant);
    if (!info.ok()) return InOwner(name, info.status());
    info->member = MemberOf(name);
    return info;
  }
  v1::DescribeGroupRequest request;
  request.set_name(name);
  if (tenant.has_value()) request.set_tenant(*tenant);
  v1::DescribeGroupResponse response;
  absl::Status status =
      UnaryWithRetries(impl_->options, impl_->channel.get(), [&](grpc::ClientContext* context) {
        return impl_->stub->DescribeGroup(context, request, &response);
      });
  if (!status.ok()) return impl_->Explain(status);
  return GroupInfoFromProto(response.group().info());
}

absl::StatusOr<std::vector<GroupInfo>> Client::ListGroups() {
  if (impl_->several) return ListMembers();
  // Page by page (each retried on its own) until the daemon says none is left.
  std::vector<GroupInfo> out;
  v1::ListGroupsRequest request;
  do {
    v1::ListGroupsResponse response;
    absl::Status status =
        UnaryWithRetries(impl_->options, impl_->channel.get(), [&](grpc::ClientContext* context) {
          return impl_->stub->ListGroups(context, request, &response);
        });
    if (!status.ok()) return impl_->Explain(status);
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
  if (impl_->several) return StatsOfMembers();
  // Page by page (each retried on its own): the totals as the first page
  // gives them, then every page's groups.
  std::optional<Stats> out;
  v1::GetStatsRequest request;
  do {
    v1::GetStatsResponse response;
    absl::Status status =
        UnaryWithRetries(impl_->options, impl_->channel.get(), [&](grpc::ClientContext* context) {
          return impl_->stub->GetStats(context, request, &response);
        });
    if (!status.ok()) return impl_->Explain(status);
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

absl::StatusOr<Stats> Client::DaemonFacts(absl::Time deadline) {
  v1::GetStatsRequest request;
  request.set_page_size(1);
  v1::GetStatsResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, impl_->options);
  if (deadline != absl::InfiniteFuture() && absl::ToChronoTime(deadline) < context.deadline()) {
    context.set_deadline(absl::ToChronoTime(deadline));
  }
  absl::Status status = FromGrpcStatus(impl_->stub->GetStats(&context, request, &response));
  if (!status.ok()) return impl_->Explain(status);
  return client_internal::StatsFromProto(response);
}

absl::Status Client::RideOutRestart(const std::string& group) {
  if (impl_->options.reconnect_timeout <= absl::ZeroDuration()) return absl::OkStatus();
  absl::Status status;
  if (!group.empty()) {
    // DescribeGroup costs the daemon one lookup (GetStats sums over every
    // group: a close() deleting thousands of groups would pay that each).
    v1::DescribeGroupRequest request;
    request.set_name(group);
    v1::DescribeGroupResponse response;
    status =
        UnaryWithRetries(impl_->options, impl_->channel.get(), [&](grpc::ClientContext* context) {
          return impl_->stub->DescribeGroup(context, request, &response);
        });
  } else {
    v1::GetStatsRequest request;
    request.set_page_size(1);
    v1::GetStatsResponse response;
    status =
        UnaryWithRetries(impl_->options, impl_->channel.get(), [&](grpc::ClientContext* context) {
          return impl_->stub->GetStats(context, request, &response);
        });
  }
  // Any answer but a transient failure: the daemon is there (the call
  // itself reports a refusal of its own).
  if (status.ok() || !client_internal::IsRetryable(status)) return absl::OkStatus();
  return impl_->Explain(status);
}

absl::Status Client::DeleteGroup(const std::string& name,
                                 const std::optional<std::string>& tenant) {
  if (Client* owner = OwnerClient(name)) return InOwner(name, owner->DeleteGroup(name, tenant));
  if (absl::Status s = RideOutRestart(name); !s.ok()) return s;
  grpc::ClientContext context;
  PrepareContext(&context, impl_->options);
  v1::DeleteGroupRequest request;
  request.set_name(name);
  if (tenant.has_value()) request.set_tenant(*tenant);
  v1::DeleteGroupResponse response;
  impl_->Forget(name);
  absl::Status status = FromGrpcStatus(impl_->stub->DeleteGroup(&context, request, &response));
  if (status.ok()) impl_->data_plane.ForgetGroup(name);
  return impl_->Explain(status);
}

}  // namespace optstate

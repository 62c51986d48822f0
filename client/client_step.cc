// Client::Step, the one driver of a step on every data plane:
// 1. CheckStep and each group's layout and buffers (nothing sent on a
//    refusal).
// 2. The data plane: shared memory when DataPlaneChoice says so (the region
//    held for the step), else the wire; each a StepTransport.
// 3. The transport prepares the messages and checks every gradient finite
//    as the daemon will read it.
// 4. Send: the client's one retry loop (call/retry.h) runs a stream per
//    attempt (transport/step_stream.h). A retry sends every message of the
//    step again, the answered ones too: a daemon that restarted from a
//    checkpoint between attempts has lost what it answered (resending only
//    the unanswered messages then returned OK for a step whose answered
//    pages were back at step k-1), and one that did not replays them (each
//    page is applied exactly once, so resends never apply an element twice).
//    An attempt whose messages the transport sends otherwise after its
//    refusal (StepTransport::ResendAfter) is made again at once, over the
//    messages not yet answered. A group the daemon no longer knows as cached
//    (NOT_FOUND, or a length it refuses) has its cached layout dropped.
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/call/retry.h"
#include "client/client_impl.h"
#include "client/step/step_checks.h"
#include "client/step/step_input.h"
#include "client/transport/shared_memory/shared_memory_transport.h"
#include "client/transport/step_stream.h"
#include "client/transport/wire/wire_transport.h"

namespace optstate {

using client_internal::ChunkGroup;
using client_internal::ChunkLimits;
using client_internal::SharedMemoryPlane;
using client_internal::StepInput;
using client_internal::StepTransport;

absl::StatusOr<std::vector<ChunkGroup>> Client::Impl::StepLayouts(
    Client& client, absl::Span<const GroupStep> groups, const StepOptions& options,
    const ChunkLimits& limits) {
  std::vector<ChunkGroup> layouts;
  layouts.reserve(groups.size());
  for (const GroupStep& group : groups) {
    if (absl::Status s = client_internal::CheckBufferForms(group, options); !s.ok()) return s;
    absl::StatusOr<GroupInfo> layout = Layout(client, group.group);
    if (layout.ok() && group.gradient.size() != layout->num_elements) {
      // The group may have been registered anew elsewhere: ask once more.
      Forget(group.group);
      layout = Layout(client, group.group);
    }
    if (!layout.ok()) return layout.status();
    if (absl::Status s = client_internal::CheckLengths(group, layout->num_elements); !s.ok()) {
      return s;
    }
    layouts.push_back({group.group, layout->num_elements, layout->page_elements});
    // Checked here, group by group, so the first bad group is named before
    // later groups' layouts are looked up.
    if (absl::StatusOr<uint64_t> pages = PagesPerChunk(layouts.back(), limits); !pages.ok()) {
      return pages.status();
    }
  }
  return layouts;
}

absl::Status Client::Impl::Send(StepTransport& transport, size_t messages, const StepInput& input) {
  std::vector<size_t> pending;
  absl::Status status = client_internal::WithRetries(
      options, channel.get(),
      [&](int) {
        pending.resize(messages);
        for (size_t i = 0; i < messages; ++i) pending[i] = i;
        if (absl::Status s = transport.BeforeAttempt(); !s.ok()) return s;
        absl::Status s =
            client_internal::RunStepStream(channel.get(), *raw_step, options, transport, &pending);
        if (!s.ok() && transport.ResendAfter(s)) {
          s = client_internal::RunStepStream(channel.get(), *raw_step, options, transport,
                                             &pending);
        }
        return s;
      },
      absl::StrCat("step ", input.step, " (", transport.name(), ")"));
  if (absl::Status finished = transport.Finish(); status.ok()) status = std::move(finished);
  // A group deleted or registered anew elsewhere: look its layout up again next time.
  if (status.code() == absl::StatusCode::kNotFound ||
      status.code() == absl::StatusCode::kInvalidArgument) {
    for (const GroupStep& group : input.groups) Forget(group.group);
  }
  return Explain(status);
}

absl::Status Client::Step(absl::Span<const GroupStep> groups, uint64_t step,
                          const StepOptions& options) {
  return Step(groups, step, options, nullptr);
}

absl::Status Client::Step(absl::Span<const GroupStep> groups, uint64_t step,
                          const StepOptions& options, StepReport* report) {
  if (absl::Status s = client_internal::CheckStep(groups, step, options); !s.ok()) return s;
  if (impl_->several) return StepMembers(groups, step, options, report);
  absl::Status status = StepOneDaemon(groups, step, options);
  if (report != nullptr) {
    *report = StepReport();
    for (const GroupStep& g : groups) {
      if (status.ok()) {
        report->stepped.push_back(g.group);
      } else {
        report->failed.push_back({g.group, impl_->target, status});
      }
    }
  }
  return status;
}

absl::Status Client::StepOneDaemon(absl::Span<const GroupStep> groups, uint64_t step,
                                   const StepOptions& options) {
  const ChunkLimits limits{impl_->options.chunk_bytes,
                           static_cast<uint64_t>(impl_->options.max_message_bytes),
                           options.gradient_dtype, options.param_dtype};
  absl::StatusOr<std::vector<ChunkGroup>> layouts =
      impl_->StepLayouts(*this, groups, options, limits);
  if (!layouts.ok()) return layouts.status();
  const StepInput input{groups, *layouts, step, options};

  std::optional<absl::Status> status = impl_->data_plane.StepOnSharedMemory(
      impl_->channel.get(), impl_->options,
      [&](SharedMemoryPlane& plane) -> std::optional<absl::Status> {
        client_internal::SharedMemoryTransport transport(plane, impl_->channel.get(), input,
                                                         impl_->options);
        absl::StatusOr<size_t> messages = transport.Prepare();
        if (!messages.ok()) {
          // kAuto: a step the region cannot hold takes the wire.
          if (transport.layout_refused() && impl_->options.data_plane != DataPlane::kSharedMemory) {
            return std::nullopt;
          }
          return messages.status();
        }
        absl::Status sent = impl_->Send(transport, *messages, input);
        // kAuto: a daemon that restarted without what shared memory needs
        // (a region socket, room for this client's regions) gets the wire.
        // Pages an earlier attempt applied are replayed there, not applied twice.
        if (!sent.ok() && plane.refused_after_reconnect() &&
            impl_->options.data_plane == DataPlane::kAuto) {
          return std::nullopt;
        }
        return sent;
      });
  if (status.has_value()) return *status;
  client_internal::WireTransport transport(input, impl_->options);
  absl::StatusOr<size_t> messages = transport.Prepare();
  if (!messages.ok()) return messages.status();
  return impl_->Send(transport, *messages, input);
}

absl::Status Client::Step(const std::string& group, uint64_t step, ConstBufferView gradient,
                          BufferView params_out, const StepOptions& options) {
  GroupStep one{group, gradient, params_out};
  return Step(absl::MakeConstSpan(&one, 1), step, options);
}

absl::StatusOr<std::unique_ptr<SharedBuffer>> Client::AllocateSharedBuffer(uint64_t bytes) {
  if (impl_->several) {
    return absl::FailedPreconditionError(
        "a SharedBuffer is one daemon's region; a client of several daemons steps from the "
        "caller's own memory (each daemon on this host still gets shared memory)");
  }
  absl::StatusOr<std::shared_ptr<client_internal::SharedMapping>> mapping =
      impl_->data_plane.AllocateShared(impl_->channel.get(), impl_->options, bytes);
  if (!mapping.ok()) return mapping.status();
  return std::unique_ptr<SharedBuffer>(new SharedBuffer(*std::move(mapping)));
}

SharedBuffer::SharedBuffer(std::shared_ptr<client_internal::SharedMapping> mapping)
    : mapping_(std::move(mapping)) {}
SharedBuffer::~SharedBuffer() = default;
void* SharedBuffer::data() const { return mapping_->base; }
uint64_t SharedBuffer::bytes() const { return mapping_->bytes; }

}  // namespace optstate

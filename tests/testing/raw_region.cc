// The region socket's protocol (common/region_protocol.h) spoken by hand.
#include "tests/testing/raw_region.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/region_protocol.h"
#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.grpc.pb.h"

namespace optstate::testing {

namespace rp = region_protocol;

RawRegion::~RawRegion() {
  if (base != nullptr) munmap(base, bytes);
  if (memfd >= 0) close(memfd);
  if (socket >= 0) close(socket);
}

absl::Status RawRegion::Unregister() {
  rp::Request request;
  request.op = static_cast<uint32_t>(rp::Op::kUnregister);
  request.region = id;
  absl::StatusOr<rp::Reply> reply = rp::Call(socket, request);
  return reply.ok() ? rp::StatusOf(*reply) : reply.status();
}

std::string RegionSocketOf(const std::string& target) {
  auto stub =
      v1::DataPlane::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::GetDataPlaneRequest request;
  v1::GetDataPlaneResponse response;
  EXPECT_TRUE(stub->GetDataPlane(&context, request, &response).ok());
  return response.region_socket();
}

std::unique_ptr<RawRegion> OpenRegion(const std::string& path, uint64_t bytes) {
  auto region = std::make_unique<RawRegion>();
  rp::Reply hello;
  absl::StatusOr<int> socket = rp::Connect(path, &hello);
  EXPECT_TRUE(socket.ok()) << socket.status();
  if (!socket.ok()) return nullptr;
  region->socket = *socket;
  region->key.assign(reinterpret_cast<char*>(hello.session_key), rp::kKeyBytes);
  absl::StatusOr<int> memfd = rp::CreateSealedMemfd("hostile", bytes);
  EXPECT_TRUE(memfd.ok());
  region->memfd = *memfd;
  region->bytes = bytes;
  region->base = static_cast<char*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, region->memfd, 0));
  rp::Request request;
  request.op = static_cast<uint32_t>(rp::Op::kRegister);
  absl::StatusOr<rp::Reply> reply = rp::Call(region->socket, request, region->memfd);
  EXPECT_TRUE(reply.ok() && rp::StatusOf(*reply).ok());
  region->id = reply->region;
  return region;
}

}  // namespace optstate::testing

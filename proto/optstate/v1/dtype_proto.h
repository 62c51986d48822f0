// The one mapping between the wire's DType enum and optstate::WireType, for
// both ends of the wire.
#ifndef OPTSTATE_PROTO_OPTSTATE_V1_DTYPE_PROTO_H_
#define OPTSTATE_PROTO_OPTSTATE_V1_DTYPE_PROTO_H_

#include <optional>

#include "optstate/dtype.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate {

inline v1::DType WireTypeToProto(WireType type) {
  switch (type) {
    case WireType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case WireType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case WireType::kFloat16:
      return v1::DTYPE_FLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

// DTYPE_UNSPECIFIED reads as float32; nullopt for a value the enum lacks.
inline std::optional<WireType> WireTypeFromProtoValue(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FLOAT32:
      return WireType::kFloat32;
    case v1::DTYPE_BFLOAT16:
      return WireType::kBFloat16;
    case v1::DTYPE_FLOAT16:
      return WireType::kFloat16;
    default:
      return std::nullopt;
  }
}

}  // namespace optstate

#endif  // OPTSTATE_PROTO_OPTSTATE_V1_DTYPE_PROTO_H_

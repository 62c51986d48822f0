// Arguments taken as nanobind::handle (checked by the binding itself), typed
// for signatures and the generated stub: nb::typed<nb::handle, Hint> renders
// as Hint's name. stub_patterns.txt defines Buffer and GroupBuffers in the
// stub.
#ifndef OPTSTATE_PYTHON_TYPE_HINTS_H_
#define OPTSTATE_PYTHON_TYPE_HINTS_H_

#include <nanobind/nanobind.h>

namespace optstate::python {

struct BufferHint {};         // "Buffer": a numpy array or torch CPU tensor (buffers.h).
struct BufferOrCountHint {};  // register()'s initial_values: "Buffer | int".
struct StepGroupsHint {};     // step()'s groups: a name, (name, gradient, ...) tuples or a _PreparedStep.
struct WireDtypeHint {};      // step()'s wire_dtype (ParseWireType).

using BufferArg = nanobind::typed<nanobind::handle, BufferHint>;
using BufferOrCountArg = nanobind::typed<nanobind::handle, BufferOrCountHint>;
using StepGroupsArg = nanobind::typed<nanobind::handle, StepGroupsHint>;
using WireDtypeArg = nanobind::typed<nanobind::handle, WireDtypeHint>;
// stats() and checkpoint(): dicts of plain values.
using StrDict = nanobind::typed<nanobind::dict, nanobind::str, nanobind::any>;

}  // namespace optstate::python

namespace nanobind::detail {

template <>
struct type_caster<optstate::python::BufferHint> {
  static constexpr auto Name = const_name("Buffer");
};
template <>
struct type_caster<optstate::python::BufferOrCountHint> {
  static constexpr auto Name = const_name("Buffer | int");
};
template <>
struct type_caster<optstate::python::StepGroupsHint> {
  static constexpr auto Name = const_name("str | collections.abc.Sequence[GroupBuffers] | _PreparedStep");
};
template <>
struct type_caster<optstate::python::WireDtypeHint> {
  static constexpr auto Name = const_name("WireType | str | typing.Any");
};

}  // namespace nanobind::detail

#endif  // OPTSTATE_PYTHON_TYPE_HINTS_H_

// Client.step and Client.stats: the Python arguments turned into the C++
// client's GroupStep / StepOptions, and its stats into a dict. The only file
// that knows those C++ types' layout.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "buffers.h"
#include "errors.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "py_client.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace optstate::python {
namespace {

// One group of a step as the caller gave it.
struct StepEntry {
  std::string name;
  HostBuffer gradient;
  std::optional<HostBuffer> params_out;
};

StepEntry MakeEntry(const std::string& name, nb::handle gradient, nb::handle params_out,
                    const std::string& where) {
  StepEntry entry{name, ViewHostBuffer(gradient, where + "gradient", false), std::nullopt};
  if (!params_out.is_none()) {
    entry.params_out = ViewHostBuffer(params_out, where + "params_out", true);
  }
  return entry;
}

// The wire type of one direction of the call: a 16-bit buffer travels as it
// is (so all 16-bit buffers of a call must agree, and agree with an explicit
// `wire`); float32 buffers are narrowed to `wire` (float32 when unset).
WireType ResolveWire(const std::vector<const HostBuffer*>& buffers,
                     const std::optional<WireType>& wire, const char* what) {
  std::optional<ElementType> sixteen;
  for (const HostBuffer* b : buffers) {
    if (b->type == ElementType::kFloat32) continue;
    if (sixteen && *sixteen != b->type) {
      throw nb::value_error(
          absl::StrCat("step: the ", what, " buffers mix ", ElementTypeName(*sixteen), " and ",
                       ElementTypeName(b->type), "; one call carries one 16-bit type")
              .c_str());
    }
    sixteen = b->type;
  }
  if (!sixteen) return wire.value_or(WireType::kFloat32);
  if (wire && *wire != ToWireType(*sixteen)) {
    throw nb::value_error(absl::StrCat("step: ", what, " buffers of ", ElementTypeName(*sixteen),
                                       " travel as they are; wire_dtype must be unset or ",
                                       ElementTypeName(*sixteen))
                              .c_str());
  }
  return ToWireType(*sixteen);
}

// The C++ client's view of one entry.
GroupStep ToGroupStep(const StepEntry& e) {
  GroupStep g;
  g.group = e.name;
  if (e.gradient.type == ElementType::kFloat32) {
    g.gradient = e.gradient.floats();
  } else {
    g.gradient16 = e.gradient.halves();
  }
  if (e.params_out) {
    if (e.params_out->type == ElementType::kFloat32) {
      g.params_out = e.params_out->mutable_floats();
    } else {
      g.params_out16 = e.params_out->mutable_halves();
    }
  }
  return g;
}

nb::object FieldValue(const google::protobuf::Message& m,
                      const google::protobuf::FieldDescriptor* f, int index);

// A message as a dict of its fields (plain proto3 fields at their defaults when unset).
nb::dict MessageToDict(const google::protobuf::Message& m) {
  nb::dict out;
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    // Unset fields with presence (proto3 `optional`, messages) are left out:
    // the retired float32 hyperparameters, say, would only read as zeros.
    if (!f->is_repeated() && f->has_presence() && !r->HasField(m, f)) continue;
    if (f->is_repeated()) {
      nb::list values;
      for (int j = 0; j < r->FieldSize(m, f); ++j) values.append(FieldValue(m, f, j));
      out[f->name().c_str()] = values;
    } else {
      out[f->name().c_str()] = FieldValue(m, f, -1);
    }
  }
  return out;
}

nb::object FieldValue(const google::protobuf::Message& m,
                      const google::protobuf::FieldDescriptor* f, int index) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return nb::int_(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
    case FD::CPPTYPE_INT64:
      return nb::int_(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case FD::CPPTYPE_UINT32:
      return nb::int_(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
    case FD::CPPTYPE_UINT64:
      return nb::int_(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case FD::CPPTYPE_DOUBLE:
      return nb::float_(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case FD::CPPTYPE_FLOAT:
      return nb::float_(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case FD::CPPTYPE_BOOL:
      return nb::bool_(rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
    case FD::CPPTYPE_ENUM: {
      const google::protobuf::EnumValueDescriptor* e =
          rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f);
      return nb::str(e->name().c_str());
    }
    case FD::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      return nb::str(s.data(), s.size());
    }
    case FD::CPPTYPE_MESSAGE:
      return MessageToDict(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nb::none();
}

}  // namespace

void BindStepAndStats(nb::class_<PyClient>& cls) {
  cls.def(
      "step",
      [](PyClient& self, nb::handle groups, uint64_t step, nb::handle gradient,
         nb::handle params_out, std::optional<double> lr, std::optional<float> grad_scale,
         nb::handle wire_dtype) {
        // 1. Every buffer viewed and checked, with the GIL, before anything is sent.
        std::vector<StepEntry> entries;
        if (nb::isinstance<nb::str>(groups)) {
          if (gradient.is_none()) throw nb::type_error("step: gradient is required with one group");
          entries.push_back(MakeEntry(nb::cast<std::string>(groups), gradient, params_out, ""));
        } else {
          if (!gradient.is_none() || !params_out.is_none()) {
            throw nb::type_error(
                "step: with a list of groups, give each group's buffers in its tuple "
                "(name, gradient[, params_out]), not as gradient=/params_out=");
          }
          size_t i = 0;
          for (nb::handle item : groups) {
            const std::string where = absl::StrCat("groups[", i++, "].");
            nb::tuple t;
            if (!nb::try_cast<nb::tuple>(item, t) || t.size() < 2 || t.size() > 3) {
              throw nb::type_error(absl::StrCat(where.substr(0, where.size() - 1),
                                                ": expected a tuple (name, gradient[, params_out])")
                                       .c_str());
            }
            entries.push_back(MakeEntry(nb::cast<std::string>(t[0]), t[1],
                                        t.size() == 3 ? nb::handle(t[2]) : nb::none(), where));
          }
        }
        std::optional<WireType> wire;
        if (!wire_dtype.is_none()) wire = ParseWireType(wire_dtype, "wire_dtype");
        std::vector<const HostBuffer*> gradients, outs;
        for (const StepEntry& e : entries) {
          gradients.push_back(&e.gradient);
          if (e.params_out) outs.push_back(&*e.params_out);
        }
        StepOptions options;
        options.gradient_dtype = ResolveWire(gradients, wire, "gradient");
        options.param_dtype = ResolveWire(outs, wire, "params_out");
        options.lr = lr;
        options.grad_scale = grad_scale;
        std::vector<GroupStep> steps;
        steps.reserve(entries.size());
        for (const StepEntry& e : entries) steps.push_back(ToGroupStep(e));
        // 2. The whole step without the GIL; `entries` keeps the arrays alive.
        absl::Status status;
        {
          nb::gil_scoped_release release;
          status = self.client->Step(steps, step, options);
        }
        ThrowIfError(status, self.target);
      },
      "groups"_a, "step"_a, "gradient"_a = nb::none(), "params_out"_a = nb::none(), nb::kw_only(),
      "lr"_a = nb::none(), "grad_scale"_a = nb::none(), "wire_dtype"_a = nb::none(),
      "Applies step `step` (1, 2, ...) to one group or to many in one stream.\n\n"
      "`groups` is a group name (then give `gradient` and optionally `params_out`) or a list\n"
      "of tuples (name, gradient[, params_out]). Buffers are numpy arrays or torch CPU\n"
      "tensors, C-contiguous float32, bfloat16 or float16, read and written in place (a\n"
      "tensor that requires grad: pass .detach()). float32 buffers travel as `wire_dtype`\n"
      "(float32 unless set to 'bfloat16' or 'float16'); 16-bit buffers travel as they are.\n"
      "`lr` overrides the groups' lr for this step, `grad_scale` multiplies every gradient.\n\n"
      "Nothing is sent when a buffer is of the wrong kind (TypeError/ValueError naming it)\n"
      "or a gradient is not finite or has the wrong length (InvalidArgument). Transient\n"
      "failures resend what got no reply; the daemon applies every page exactly once, so\n"
      "repeating a step replays it (nothing applied twice, current params returned).");

  cls.def(
      "stats",
      [](PyClient& self) {
        absl::StatusOr<v1::GetStatsResponse> stats;
        {
          nb::gil_scoped_release release;
          stats = self.client->GetStats();
        }
        ThrowIfError(stats.status(), self.target);
        return MessageToDict(*stats);
      },
      "The daemon's counters as a dict (GetStatsResponse's fields: backend, num_groups,\n"
      "host_bytes, chunks_applied, chunks_replayed, groups: [per-group dicts], ...).");
}

}  // namespace optstate::python

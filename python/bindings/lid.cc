// connex.Lid and the conversions every binding uses to accept the reference's LID forms: a
// ("demo", 1, 0, 1) tuple or a "demo/g1/s0/r1" string as well as a Lid.
#include "connex/base/strings.h"
#include "python/bindings/common.h"

namespace connex::python {
namespace {

uint32_t ToIndex(py::handle item, const char* field) {
  if (!py::isinstance<py::int_>(item) || py::isinstance<py::bool_>(item)) {
    throw py::type_error(std::string("lid: ") + field + " must be an int, not " +
                         std::string(py::str(py::type::handle_of(item).attr("__name__"))));
  }
  long long v = item.cast<long long>();
  if (v < 0 || v > static_cast<long long>(UINT32_MAX)) {
    RaiseStatus(absl::InvalidArgumentError(
        StrCat("lid: ", field, " must be in [0, 4294967295], not ", std::to_string(v))));
  }
  return static_cast<uint32_t>(v);
}

Lid FromParts(const std::string& model, uint32_t group, uint32_t shard, uint32_t replica) {
  ThrowIfError(Lid::ValidateModel(model));
  return Lid{model, group, shard, replica};
}

py::tuple AsTuple(const Lid& lid) {
  return py::make_tuple(lid.model, lid.group, lid.shard, lid.replica);
}

}  // namespace

Lid ToLid(py::handle value, std::string_view what) {
  if (py::isinstance<Lid>(value)) return value.cast<Lid>();
  if (py::isinstance<py::str>(value)) {
    absl::StatusOr<Lid> lid = Lid::Parse(value.cast<std::string>());
    if (!lid.ok()) {
      RaiseStatus(absl::InvalidArgumentError(StrCat(what, ": ", lid.status().message())));
    }
    return *lid;
  }
  if (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(value);
    if (seq.size() != 4) {
      RaiseStatus(absl::InvalidArgumentError(
          StrCat(what, ": a LID tuple is (model, group, shard, replica), got ",
                 std::to_string(seq.size()), " items")));
    }
    if (!py::isinstance<py::str>(seq[0])) {
      throw py::type_error(StrCat(what, ": the model (first item) must be a str"));
    }
    return FromParts(seq[0].cast<std::string>(), ToIndex(seq[1], "group"), ToIndex(seq[2], "shard"),
                     ToIndex(seq[3], "replica"));
  }
  throw py::type_error(
      StrCat(what,
             ": expected a connex.Lid, a (model, group, shard, replica) tuple or a "
             "'model/g1/s0/r1' string, not ",
             std::string(py::str(py::type::handle_of(value).attr("__name__")))));
}

void RegisterLid(py::module_& m) {
  py::class_<Lid>(m, "Lid",
                  "A stable logical endpoint identity (model, group, shard, replica), printed "
                  "as 'model/g1/s0/r1'. Compares and hashes equal to its tuple form, and unpacks "
                  "like one. Every API that takes a LID also takes the tuple or the string.")
      .def(py::init(&FromParts), py::arg("model"), py::arg("group"), py::arg("shard"),
           py::arg("replica"))
      .def(py::init([](py::object value) { return ToLid(value); }), py::arg("value"),
           "From a ('model', group, shard, replica) tuple, a 'model/g1/s0/r1' string or a Lid.")
      .def_static(
          "parse", [](const std::string& text) { return ToLid(py::str(text)); }, py::arg("text"),
          "Parses 'model/g1/s0/r1'; connex.InvalidArgument names the bad part.")
      .def_readonly("model", &Lid::model)
      .def_readonly("group", &Lid::group)
      .def_readonly("shard", &Lid::shard)
      .def_readonly("replica", &Lid::replica)
      .def("to_tuple", &AsTuple, "('model', group, shard, replica)")
      .def("__str__", &Lid::ToString)
      .def("__repr__",
           [](const Lid& lid) {
             return "Lid(" + std::string(py::repr(py::str(lid.model))) + ", " +
                    std::to_string(lid.group) + ", " + std::to_string(lid.shard) + ", " +
                    std::to_string(lid.replica) + ")";
           })
      .def("__hash__", [](const Lid& lid) { return py::hash(AsTuple(lid)); })
      .def("__eq__",
           [](const Lid& lid, py::object other) {
             if (!py::isinstance<Lid>(other) && !py::isinstance<py::tuple>(other) &&
                 !py::isinstance<py::str>(other)) {
               return false;
             }
             try {
               return ToLid(other) == lid;
             } catch (py::error_already_set&) {
               return false;
             } catch (py::type_error&) {
               return false;
             }
           })
      .def("__lt__", [](const Lid& a, py::object b) { return a < ToLid(b); })
      .def("__len__", [](const Lid&) { return 4; })
      .def("__iter__", [](const Lid& lid) { return py::iter(AsTuple(lid)); })
      .def("__getitem__", [](const Lid& lid, py::object i) { return AsTuple(lid)[i]; })
      .def(py::pickle([](const Lid& lid) { return AsTuple(lid); },
                      [](py::tuple t) { return ToLid(t); }));

  py::class_<transport::PeerRef>(m, "PeerRef",
                                 "A peer as the directory publishes it: its LID and one address "
                                 "per transport it serves.")
      .def(py::init([](py::object lid, std::vector<std::string> addresses) {
             return transport::PeerRef{ToLid(lid), std::move(addresses)};
           }),
           py::arg("lid"), py::arg("addresses"))
      .def_readonly("lid", &transport::PeerRef::lid)
      .def_readonly("addresses", &transport::PeerRef::addresses)
      .def("__repr__", [](const transport::PeerRef& p) {
        return "PeerRef(" + p.lid.ToString() + ", " + std::string(py::repr(py::cast(p.addresses))) +
               ")";
      });
}

}  // namespace connex::python

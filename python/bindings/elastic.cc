// connex.elastic: ElasticPeerSet (a sender's live view of one group of endpoints) and the
// acknowledged message channels it sends over (MessageInbox on the receiving side).
#include "connex/base/strings.h"
#include "connex/elastic/channel.h"
#include "connex/elastic/peer_set.h"
#include "python/bindings/directory.h"
#include "python/bindings/transport.h"

namespace connex::python {

using elastic::ElasticPeerSet;
using elastic::MessageInbox;
using elastic::PeerChange;
using elastic::PeerInfo;
using elastic::PeerState;

namespace {

class PyPeerSet {
 public:
  PyPeerSet(PyDirectoryClient& owner, PyTransferEngine* engine,
            elastic::ElasticPeerSetOptions options)
      : client_(owner.Get()), engine_(engine ? engine->Get() : nullptr) {
    transport::TransferEngine* t = engine_ ? engine_->engine.get() : nullptr;
    peers_ = OwnWithoutGil(Blocking(
        [&] { return std::make_unique<ElasticPeerSet>(*client_, t, std::move(options)); }));
    closer_ = RegisterCloser(kClosePeerSets, [this] { Close(); });
  }
  ~PyPeerSet() {
    UnregisterCloser(closer_);
    Close();
  }
  void Close() {
    for (auto& [id, slot] : callbacks_) slot->Clear();
    callbacks_.clear();
    WithoutGil([&] { dispatcher_->Stop(); });
    std::shared_ptr<ElasticPeerSet> peers = std::move(peers_);
    peers.reset();  // before the client and the engine it uses
    WithoutGil([&] {
      client_.reset();
      engine_.reset();
    });
  }
  std::shared_ptr<ElasticPeerSet> Get() const {
    if (peers_ == nullptr) throw std::runtime_error("ElasticPeerSet is closed");
    return peers_;
  }
  uint64_t OnChange(py::function callback) {
    auto peers = Get();
    auto slot = std::make_shared<CallbackSlot>(callback);
    uint64_t id = Blocking([&] { return peers->OnChange(dispatcher_->Poster<PeerChange>(slot)); });
    callbacks_.emplace(id, slot);
    return id;
  }
  void RemoveCallback(uint64_t id) {
    auto it = callbacks_.find(id);
    if (it == callbacks_.end()) {
      RaiseStatus(absl::NotFoundError(StrCat("remove_callback: no callback ", id)));
    }
    it->second->Clear();
    callbacks_.erase(it);
    auto peers = Get();
    WithoutGil([&] { peers->RemoveCallback(id); });
  }

 private:
  std::shared_ptr<directory::DirectoryClient> client_;
  std::shared_ptr<EngineState> engine_;
  std::shared_ptr<ElasticPeerSet> peers_;
  std::map<uint64_t, CallbackSlotPtr> callbacks_;
  const DispatcherPtr dispatcher_ = Dispatcher::Create();
  uint64_t closer_ = 0;
};

class PyInbox {
 public:
  explicit PyInbox(std::unique_ptr<MessageInbox> inbox) : inbox_(OwnWithoutGil(std::move(inbox))) {
    closer_ = RegisterCloser(kCloseClients, [this] { Stop(); });
  }
  ~PyInbox() {
    UnregisterCloser(closer_);
    Stop();
  }
  void Stop() {
    std::shared_ptr<MessageInbox> inbox = std::move(inbox_);
    if (inbox == nullptr) return;
    WithoutGil([&] {
      inbox->Stop();
      inbox.reset();
    });
  }
  std::shared_ptr<MessageInbox> Get() const {
    if (inbox_ == nullptr) throw std::runtime_error("MessageInbox is stopped");
    return inbox_;
  }

 private:
  std::shared_ptr<MessageInbox> inbox_;
  uint64_t closer_ = 0;
};

}  // namespace

void RegisterElastic(py::module_& m) {
  py::enum_<PeerState> peer_state(m, "PeerState", "An incarnation's state in a peer set.");
  peer_state.value("LIVE", PeerState::kLive)
      .value("DRAINING", PeerState::kDraining)
      .value("FAILED", PeerState::kFailed)
      .value("UNKNOWN", PeerState::kUnknown);
  // str() is the C++ name ("draining"), as the C++ tools print it (replaces the enum's own).
  peer_state.attr("__str__") =
      py::cpp_function([](PeerState s) { return std::string(elastic::PeerStateName(s)); },
                       py::is_method(peer_state));

  py::enum_<PeerChange::Kind>(m, "PeerChangeKind", "What became of a peer.")
      .value("JOINED", PeerChange::Kind::kJoined)
      .value("LEFT", PeerChange::Kind::kLeft)
      .value("FAILED", PeerChange::Kind::kFailed)
      .value("MIGRATED", PeerChange::Kind::kMigrated)
      .value("SUSPECTED", PeerChange::Kind::kSuspected);

  py::class_<PeerChange>(m, "PeerChange", "A change of a peer set, as its callbacks see it.")
      .def_readonly("kind", &PeerChange::kind)
      .def_readonly("record", &PeerChange::record)
      .def_property_readonly("lid", [](const PeerChange& c) { return c.record.lid; })
      .def_readonly("previous_epoch", &PeerChange::previous_epoch)
      .def_readonly("local", &PeerChange::local,
                    "A local decision (mark_failed, a transport event), not a directory event.")
      .def_readonly("reason", &PeerChange::reason)
      .def("__repr__", [](const PeerChange& c) {
        return StrCat("PeerChange(", elastic::PeerChangeKindName(c.kind), " ",
                      c.record.lid.ToString(), " epoch=", c.record.epoch,
                      c.reason.empty() ? "" : " reason=" + c.reason, ")");
      });

  py::class_<PeerInfo>(m, "PeerInfo", "A member of a peer set with its state.")
      .def_readonly("record", &PeerInfo::record)
      .def_readonly("state", &PeerInfo::state)
      .def_readonly("suspected", &PeerInfo::suspected)
      .def_readonly("reason", &PeerInfo::reason);

  py::class_<PyInbox>(m, "MessageInbox",
                      "Receives acknowledged messages at a 'zmq+tcp://HOST:PORT' address (what "
                      "an endpoint publishes for ElasticPeerSet.send).")
      .def(py::init([](const std::string& host) {
             auto inbox = Blocking([&] { return MessageInbox::Start(host); });
             return std::make_unique<PyInbox>(ValueOrThrow(std::move(inbox)));
           }),
           py::arg("host") = "127.0.0.1")
      .def_property_readonly("address", [](const PyInbox& i) { return i.Get()->address(); })
      .def(
          "receive",
          [](PyInbox& self, std::optional<double> timeout) -> std::optional<py::bytes> {
            auto inbox = self.Get();
            auto deadline =
                std::chrono::steady_clock::now() +
                std::chrono::milliseconds(static_cast<int64_t>(timeout.value_or(0) * 1000));
            while (true) {
              int64_t slice = 100;
              if (timeout) {
                int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now())
                                   .count();
                slice = std::max<int64_t>(0, std::min<int64_t>(left, 100));
              }
              std::optional<std::string> got = Blocking([&] { return inbox->Receive(slice); });
              if (got) return py::bytes(*got);
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
              if (timeout && std::chrono::steady_clock::now() >= deadline) return std::nullopt;
            }
          },
          py::arg("timeout") = py::none(),
          "The next message (bytes), or None after `timeout` seconds (None: wait).")
      .def("stop", &PyInbox::Stop,
           "Closes the socket: senders get no acknowledgement any more, as from a dead process.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyInbox& self, py::args) { self.Stop(); });

  py::class_<PyPeerSet>(
      m, "ElasticPeerSet",
      "A sender's live view of one group of endpoints (every replica of one stage): follows the "
      "directory's events and the transport's peer-death events, picks a peer (sticky, then by "
      "replica), evicts failed peers for every sender, and sends acknowledged messages. Holds "
      "`owner` and `transport` until closed. Thread-safe; blocking calls release the GIL.")
      .def(py::init([](PyDirectoryClient& owner, PyTransferEngine* transport, uint32_t stage_idx,
                       std::optional<std::string> model, std::optional<uint32_t> own_replica,
                       int64_t send_timeout_ms, std::string reporter, std::optional<uint32_t> shard,
                       std::string member_address_prefix) {
             elastic::ElasticPeerSetOptions o;
             if (model) {
               o.model = *model;
             } else {
               o.model = owner.OwnLid("ElasticPeerSet (no model=)").model;
             }
             o.group = stage_idx;
             o.own_replica = own_replica.value_or(owner.lid() ? owner.lid()->replica : 0);
             o.send_timeout_ms = send_timeout_ms;
             o.reporter = std::move(reporter);
             o.shard = shard;
             o.member_address_prefix = std::move(member_address_prefix);
             ThrowIfError(Lid::ValidateModel(o.model));
             return std::make_unique<PyPeerSet>(owner, transport, std::move(o));
           }),
           py::arg("owner"), py::arg("transport") = nullptr, py::arg("stage_idx") = 0,
           py::kw_only(), py::arg("model") = py::none(), py::arg("own_replica") = py::none(),
           py::arg("send_timeout_ms") = 1000, py::arg("reporter") = "elastic-peer-set",
           py::arg("shard") = py::none(), py::arg("member_address_prefix") = "",
           "The group `stage_idx` of `model` (default: the owner's model), seen through `owner` "
           "(a started DirectoryClient) and `transport` (a TransferEngine, or None: directory "
           "events only). Call start() next.")
      .def(
          "start",
          [](PyPeerSet& self) {
            auto p = self.Get();
            ThrowIfError(Blocking([&] { return p->Start(); }));
          },
          "Watches the model and builds the view (connex.Fenced the second time).")
      .def(
          "wait_ready",
          [](PyPeerSet& self, size_t n, double timeout) {
            auto p = self.Get();
            return Blocking([&] { return p->WaitReady(n, static_cast<int64_t>(timeout * 1000)); });
          },
          py::arg("n"), py::arg("timeout") = 5.0,
          "Waits until at least `n` peers are live; returns whether they were within `timeout` s.")
      .def(
          "peers",
          [](PyPeerSet& self) {
            auto p = self.Get();
            return Blocking([&] { return p->Peers(); });
          },
          "Live peers' records, sorted by LID.")
      .def(
          "peer_lids",
          [](PyPeerSet& self) {
            auto p = self.Get();
            return Blocking([&] { return p->PeerLids(); });
          },
          "Live peers' LIDs, sorted.")
      .def(
          "members",
          [](PyPeerSet& self) {
            auto p = self.Get();
            return Blocking([&] { return p->Members(); });
          },
          "Live, draining and recently failed incarnations with their state.")
      .def(
          "live",
          [](PyPeerSet& self, py::object lid) {
            Lid l = ToLid(lid);
            auto p = self.Get();
            return Blocking([&] { return p->Live(l); });
          },
          py::arg("lid"), "The live record of `lid`, or None.")
      .def(
          "is_usable",
          [](PyPeerSet& self, py::object lid, uint64_t epoch) {
            Lid l = ToLid(lid);
            auto p = self.Get();
            return Blocking([&] { return p->IsUsable(l, epoch); });
          },
          py::arg("lid"), py::arg("epoch"))
      .def(
          "state_of",
          [](PyPeerSet& self, py::object lid, uint64_t epoch) {
            Lid l = ToLid(lid);
            auto p = self.Get();
            return Blocking([&] { return p->StateOf(l, epoch); });
          },
          py::arg("lid"), py::arg("epoch"))
      .def(
          "pick",
          [](PyPeerSet& self, py::object current) {
            std::optional<Lid> c;
            if (!current.is_none()) c = ToLid(current, "current");
            auto p = self.Get();
            return ValueOrThrow(Blocking([&] { return p->Pick(c ? &*c : nullptr); }));
          },
          py::arg("current") = py::none(),
          "The sticky pick: `current` if still live, else the caller's replica, else the next "
          "live one. connex.Unavailable when no peer is live.")
      .def(
          "pick_record",
          [](PyPeerSet& self, py::object current) {
            std::optional<Lid> c;
            if (!current.is_none()) c = ToLid(current, "current");
            auto p = self.Get();
            return ValueOrThrow(Blocking([&] { return p->PickRecord(c ? &*c : nullptr); }));
          },
          py::arg("current") = py::none())
      .def(
          "send",
          [](PyPeerSet& self, py::object lid, py::buffer data) {
            Lid l = ToLid(lid);
            py::buffer_info info = data.request();  // the channel copies the message anyway
            if (!PyBuffer_IsContiguous(info.view(), 'A')) {
              throw py::value_error("send: the data buffer is not contiguous");
            }
            std::string bytes(static_cast<const char*>(info.ptr),
                              static_cast<size_t>(info.size * info.itemsize));
            auto p = self.Get();
            ThrowIfError(Blocking([&] { return p->Send(l, bytes); }));
          },
          py::arg("lid"), py::arg("data"),
          "Sends `data` (bytes or any buffer) to live `lid` and waits for its acknowledgement. "
          "connex.Unavailable: "
          "the peer is not live, did not acknowledge, or was evicted meanwhile.")
      .def(
          "mark_failed",
          [](PyPeerSet& self, py::object lid, uint64_t epoch) {
            Lid l = ToLid(lid);
            auto p = self.Get();
            ThrowIfError(Blocking([&] { return p->MarkFailed(l, epoch); }));
          },
          py::arg("lid"), py::arg("epoch") = 0,
          "Evicts (lid, epoch) here at once (0: the live epoch) and reports it to the directory, "
          "which evicts it for every sender. connex.NotFound when neither live nor draining.")
      .def("on_change", &PyPeerSet::OnChange, py::arg("callback"),
           "Calls callback(PeerChange) for every change, in order, on this peer set's callback "
           "thread (with the GIL); it may call the peer set's methods. Returns an id.")
      .def("remove_callback", &PyPeerSet::RemoveCallback, py::arg("id"))
      .def_property_readonly("pending_reports",
                             [](PyPeerSet& self) {
                               auto p = self.Get();
                               return Blocking([&] { return p->pending_reports(); });
                             })
      .def_property_readonly(
          "stats",
          [](PyPeerSet& self) {
            auto p = self.Get();
            elastic::ElasticPeerSetStats s = Blocking([&] { return p->stats(); });
            py::dict d;
            d["transport_evictions"] = s.transport_evictions;
            d["local_evictions"] = s.local_evictions;
            d["stale_transport_events"] = s.stale_transport_events;
            d["suspicions"] = s.suspicions;
            d["reports_sent"] = s.reports_sent;
            d["reports_failed"] = s.reports_failed;
            d["reports_dropped"] = s.reports_dropped;
            d["watches"] = s.watches;
            d["watch_errors"] = s.watch_errors;
            d["channels_opened"] = s.channels_opened;
            d["open_channels"] = s.open_channels;
            return d;
          },
          "Counters (a dict).")
      .def("close", &PyPeerSet::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyPeerSet& self, py::args) { self.Close(); });
}

}  // namespace connex::python

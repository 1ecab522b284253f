// connex.directory and connex.directory_server: DirectoryServer, DirectoryClient, their records,
// events and snapshots, and membership events as callbacks or as an iterator (EventStream).
#include "python/bindings/directory.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "connex/base/strings.h"

namespace connex::python {

using directory::DirectoryClient;
using directory::DirectoryServer;
using directory::Event;
using directory::EventKind;
using directory::Record;
using directory::RegistrationChange;
using directory::Snapshot;

std::string WithScheme(const std::string& address) {
  if (address.find("://") != std::string::npos) return address;
  return "tcp://" + address;
}

namespace {

// The CURVE settings of a key file written by `connexctl keygen` (a deployment's shared key pair:
// it admits peers with the same key); off for "".
CurveSettings CurveFromKeyFile(const std::string& path) {
  if (path.empty()) return {};
  return CurveSettings::Shared(ValueOrThrow(LoadCurveKeyFile(path)));
}

std::string ListAddresses(const std::vector<std::string>& addresses) {
  std::string out = "[";
  for (size_t i = 0; i < addresses.size(); ++i) out += (i ? ", " : "") + addresses[i];
  return out + "]";
}

// ---- DirectoryServer ----

class PyDirectoryServer {
 public:
  explicit PyDirectoryServer(directory::DirectoryServerOptions options)
      : options_(std::move(options)) {
    closer_ = RegisterCloser(kCloseServers, [this] { Stop(); });
  }
  ~PyDirectoryServer() {
    UnregisterCloser(closer_);
    Stop();
  }

  void Start() {
    if (server_ != nullptr) return;
    auto server = Blocking([&] { return DirectoryServer::Start(options_); });
    server_ = OwnWithoutGil(ValueOrThrow(std::move(server)));
  }
  void Stop() {
    std::shared_ptr<DirectoryServer> server = std::move(server_);
    if (server == nullptr) return;
    WithoutGil([&] { server->Stop(); });
    server.reset();  // destroyed without the GIL (OwnWithoutGil)
  }
  const DirectoryServer& Get() const {
    if (server_ == nullptr) throw std::runtime_error("DirectoryServer is not running (start())");
    return *server_;
  }
  bool running() const { return server_ != nullptr; }
  const directory::DirectoryServerOptions& options() const { return options_; }

 private:
  directory::DirectoryServerOptions options_;
  std::shared_ptr<DirectoryServer> server_;
  uint64_t closer_ = 0;
};

// ---- EventStream: events as an iterator ----

struct EventQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;
  bool closed = false;
};

class PyEventStream {
 public:
  PyEventStream(PyDirectoryClient& owner, std::optional<std::string> model)
      : client_(owner.Get()), queue_(std::make_shared<EventQueue>()) {
    std::shared_ptr<EventQueue> q = queue_;
    subscription_ = Blocking([&] {
      return client_->Subscribe([q, model](const Event& e) {
        if (model && e.record.lid.model != *model) return;
        std::lock_guard<std::mutex> lock(q->mu);
        if (q->closed) return;
        q->events.push_back(e);
        q->cv.notify_all();
      });
    });
    closer_ = RegisterCloser(kCloseIterators, [this] { Close(); });
  }
  ~PyEventStream() {
    UnregisterCloser(closer_);
    Close();
  }

  // The next event, or nullopt after `timeout_s` (None: wait until one comes or Close).
  std::optional<Event> Get(std::optional<double> timeout_s) {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(timeout_s.value_or(0)));
    while (true) {
      std::optional<Event> got;
      bool closed = false;
      {
        GilRelease release;
        std::unique_lock<std::mutex> lock(queue_->mu);
        // Slices of 100 ms, so that Ctrl-C (a signal) interrupts a wait.
        auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        if (timeout_s && deadline < until) until = deadline;
        queue_->cv.wait_until(lock, until,
                              [&] { return queue_->closed || !queue_->events.empty(); });
        if (!queue_->events.empty()) {
          got = std::move(queue_->events.front());
          queue_->events.pop_front();
        }
        closed = queue_->closed;
      }
      if (got) return got;
      if (closed) throw py::stop_iteration();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (timeout_s && std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    }
  }

  void Close() {
    {
      std::lock_guard<std::mutex> lock(queue_->mu);
      queue_->closed = true;
      queue_->cv.notify_all();
    }
    if (client_ == nullptr) return;
    std::shared_ptr<DirectoryClient> client = std::move(client_);
    WithoutGil([&] {
      client->Unsubscribe(subscription_);
      client.reset();
    });
  }

 private:
  std::shared_ptr<DirectoryClient> client_;
  std::shared_ptr<EventQueue> queue_;
  uint64_t subscription_ = 0;
  uint64_t closer_ = 0;
};

}  // namespace

// ---- DirectoryClient ----

PyDirectoryClient::PyDirectoryClient(directory::DirectoryClientOptions options,
                                     std::optional<Lid> lid,
                                     std::vector<std::string> local_addresses)
    : options_(std::move(options)),
      lid_(std::move(lid)),
      local_addresses_(std::move(local_addresses)) {
  closer_ = RegisterCloser(kCloseClients, [this] { Close(); });
}

PyDirectoryClient::~PyDirectoryClient() {
  UnregisterCloser(closer_);
  Close();
}

void PyDirectoryClient::Start() {
  if (closed_) throw std::runtime_error("DirectoryClient is closed");
  if (client_ != nullptr) return;
  auto client = Blocking([&] { return DirectoryClient::Connect(options_); });
  client_ = OwnWithoutGil(ValueOrThrow(std::move(client)));
}

void PyDirectoryClient::Close() {
  closed_ = true;
  // No C++ thread calls these callables any more; the C++ client may outlive this wrapper
  // (an ElasticPeerSet holds it), with subscriptions that call nothing.
  for (auto& [id, slot] : subscriptions_) slot->Clear();
  subscriptions_.clear();
  if (registration_slot_) registration_slot_->Clear();
  registration_slot_.reset();
  WithoutGil([&] { dispatcher_->Stop(); });
  std::shared_ptr<DirectoryClient> client = std::move(client_);
  client.reset();  // destroyed without the GIL when this was the last holder
}

std::shared_ptr<DirectoryClient> PyDirectoryClient::Get() const {
  if (client_ == nullptr) {
    throw std::runtime_error(closed_ ? "DirectoryClient is closed"
                                     : "DirectoryClient is not started (call start())");
  }
  return client_;
}

const Lid& PyDirectoryClient::OwnLid(const char* what) const {
  if (!lid_) {
    RaiseStatus(absl::InvalidArgumentError(StrCat(
        what, ": this DirectoryClient has no LID of its own (pass model=..., stage_idx=...)")));
  }
  return *lid_;
}

uint64_t PyDirectoryClient::Subscribe(py::function callback) {
  std::shared_ptr<DirectoryClient> client = Get();
  auto slot = std::make_shared<CallbackSlot>(callback);
  uint64_t id = Blocking([&] { return client->Subscribe(dispatcher_->Poster<Event>(slot)); });
  subscriptions_.emplace(id, slot);
  return id;
}

void PyDirectoryClient::Unsubscribe(uint64_t id) {
  auto it = subscriptions_.find(id);
  if (it == subscriptions_.end()) {
    RaiseStatus(absl::NotFoundError(StrCat("unsubscribe: no subscription ", id)));
  }
  it->second->Clear();
  subscriptions_.erase(it);
  std::shared_ptr<DirectoryClient> client = Get();
  WithoutGil([&] { client->Unsubscribe(id); });
}

void PyDirectoryClient::OnRegistrationChange(py::object callback) {
  std::shared_ptr<DirectoryClient> client = Get();
  if (registration_slot_) registration_slot_->Clear();
  registration_slot_.reset();
  if (callback.is_none()) {
    WithoutGil([&] { client->OnRegistrationChange(nullptr); });
    return;
  }
  auto slot = std::make_shared<CallbackSlot>(callback);
  registration_slot_ = slot;
  WithoutGil([&] { client->OnRegistrationChange(dispatcher_->Poster<RegistrationChange>(slot)); });
}

void RegisterDirectory(py::module_& m) {
  py::enum_<EventKind>(m, "EventKind", "What happened to a record.")
      .value("JOINED", EventKind::kJoined)
      .value("LEFT", EventKind::kLeft)
      .value("FAILED", EventKind::kFailed)
      .value("MIGRATED", EventKind::kMigrated);

  py::class_<Record>(m, "Record", "One registered endpoint: LID, epoch, addresses, metadata.")
      .def_readonly("lid", &Record::lid)
      .def_readonly("epoch", &Record::epoch)
      .def_readonly("addresses", &Record::addresses)
      .def_readonly("metadata", &Record::metadata)
      .def_readonly("lease_left_ms", &Record::lease_left_ms, "At the time the server encoded it.")
      .def("__eq__", [](const Record& a, const Record& b) { return a == b; })
      .def("__repr__", [](const Record& r) {
        return StrCat("Record(", r.lid.ToString(), ", epoch=", r.epoch,
                      ", addresses=", ListAddresses(r.addresses), ")");
      });

  py::class_<Event>(m, "Event", "A membership event with its directory-wide revision.")
      .def_readonly("revision", &Event::revision)
      .def_readonly("kind", &Event::kind)
      .def_readonly("record", &Event::record,
                    "The record joined or migrated to, or the one that left or failed.")
      .def_property_readonly("lid", [](const Event& e) { return e.record.lid; })
      .def_property_readonly("epoch", [](const Event& e) { return e.record.epoch; })
      .def_readonly("previous_epoch", &Event::previous_epoch, "MIGRATED: the epoch before.")
      .def_readonly("reason", &Event::reason, "FAILED: lease-expired, reported, superseded.")
      .def("__repr__", [](const Event& e) {
        return StrCat("Event(", directory::EventKindName(e.kind), " ", e.record.lid.ToString(),
                      " epoch=", e.record.epoch, " revision=", e.revision,
                      e.reason.empty() ? "" : " reason=" + e.reason, ")");
      });

  py::class_<Snapshot>(m, "Snapshot", "A consistent view of the directory at `revision`.")
      .def_readonly("incarnation", &Snapshot::incarnation)
      .def_readonly("revision", &Snapshot::revision)
      .def_readonly("model_revision", &Snapshot::model_revision)
      .def_readonly("records", &Snapshot::records)
      .def("__len__", [](const Snapshot& s) { return s.records.size(); })
      .def("__repr__", [](const Snapshot& s) {
        return StrCat("Snapshot(revision=", s.revision, ", ", s.records.size(), " records)");
      });

  py::class_<RegistrationChange>(m, "RegistrationChange",
                                 "What happened to one of this client's registrations.")
      .def_readonly("lid", &RegistrationChange::lid)
      .def_readonly("old_epoch", &RegistrationChange::old_epoch)
      .def_readonly("new_epoch", &RegistrationChange::new_epoch, "0 when the registration is gone.")
      .def_property_readonly(
          "ok", [](const RegistrationChange& c) { return c.status.ok(); },
          "True: rejoined under new_epoch.")
      .def_property_readonly(
          "message", [](const RegistrationChange& c) { return std::string(c.status.message()); })
      .def("__repr__", [](const RegistrationChange& c) {
        return StrCat("RegistrationChange(", c.lid.ToString(), " ", c.old_epoch, " -> ",
                      c.new_epoch, c.status.ok() ? "" : ": " + std::string(c.status.message()),
                      ")");
      });

  py::class_<PyDirectoryServer>(
      m, "DirectoryServer",
      "The embedded in-memory directory (routes, leases, events). Addresses are 'host:port' or "
      "'tcp://host:port'; port 0 picks a free port. start() binds and starts serving; stop() is "
      "idempotent. A context manager.")
      .def(py::init([](const std::string& bind, const std::string& pub, int64_t lease_ttl_ms,
                       int64_t heartbeat_ms, std::string token, std::string admin_token,
                       int64_t tick_ms, std::string state_dir, const std::string& curve_key_file) {
             directory::DirectoryServerOptions o;
             o.curve = CurveFromKeyFile(curve_key_file);
             o.bind = WithScheme(bind);
             o.pub = WithScheme(pub);
             o.lease_ttl_ms = lease_ttl_ms;
             o.heartbeat_ms = heartbeat_ms;
             o.token = std::move(token);
             o.admin_token = std::move(admin_token);
             o.tick_ms = tick_ms;
             o.state_dir = std::move(state_dir);
             return std::make_unique<PyDirectoryServer>(std::move(o));
           }),
           py::arg("bind") = "127.0.0.1:0", py::arg("pub") = "127.0.0.1:0", py::kw_only(),
           py::arg("lease_ttl_ms") = 3000, py::arg("heartbeat_ms") = 1000, py::arg("token") = "",
           py::arg("admin_token") = "", py::arg("tick_ms") = 250, py::arg("state_dir") = "",
           py::arg("curve_key_file") = "")
      .def("start", &PyDirectoryServer::Start,
           "Binds both sockets and starts serving. connex.Unavailable when an address is taken, "
           "connex.InvalidArgument for a malformed address or setting.")
      .def("stop", &PyDirectoryServer::Stop, "Stops serving and closes the sockets. Idempotent.")
      .def_property_readonly("running", &PyDirectoryServer::running)
      .def_property_readonly(
          "bind_addr", [](const PyDirectoryServer& s) { return s.Get().bind_address(); },
          "The request endpoint actually bound, e.g. 'tcp://127.0.0.1:40123'.")
      .def_property_readonly(
          "pub_addr", [](const PyDirectoryServer& s) { return s.Get().pub_address(); },
          "The event endpoint actually bound.")
      .def_property_readonly("bind_address",
                             [](const PyDirectoryServer& s) { return s.Get().bind_address(); })
      .def_property_readonly("pub_address",
                             [](const PyDirectoryServer& s) { return s.Get().pub_address(); })
      .def_property_readonly("incarnation",
                             [](const PyDirectoryServer& s) { return s.Get().incarnation(); })
      .def_property_readonly("requests_served",
                             [](const PyDirectoryServer& s) { return s.Get().requests_served(); })
      .def("__enter__",
           [](py::object self) {
             self.cast<PyDirectoryServer&>().Start();
             return self;
           })
      .def("__exit__", [](PyDirectoryServer& s, py::args) { s.Stop(); });

  py::class_<PyEventStream>(m, "EventStream",
                            "Membership events as an iterator: `for event in stream` blocks "
                            "until the next event (Ctrl-C interrupts it) and ends at close(); "
                            "get(timeout) returns None when none came in time.")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](PyEventStream& s) { return *s.Get(std::nullopt); })
      .def(
          "get",
          [](PyEventStream& s, std::optional<double> timeout) -> std::optional<Event> {
            try {
              return s.Get(timeout);
            } catch (py::stop_iteration&) {
              return std::nullopt;
            }
          },
          py::arg("timeout") = py::none(),
          "The next event, or None after `timeout` seconds or once closed.")
      .def("close", &PyEventStream::Close, "Unsubscribes; iteration ends.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyEventStream& s, py::args) { s.Close(); });

  py::class_<PyDirectoryClient>(
      m, "DirectoryClient",
      "A client of a DirectoryServer: as a holder it registers LIDs and keeps their leases alive "
      "(heartbeats on its own thread); as a watcher it keeps a live view of watched models. "
      "Constructed idle; start() connects. With `model` (and stage_idx, shard_idx, replica_idx) "
      "it has a LID of its own for register()/deregister(), as in the reference API. Closing it "
      "(close(), or garbage collection) stops heartbeating without leaving: call leave() or "
      "deregister() first for a graceful exit. Thread-safe; blocking calls release the GIL.")
      .def(py::init([](const std::string& directory, std::optional<std::string> model,
                       uint32_t stage_idx, uint32_t shard_idx, uint32_t replica_idx,
                       std::vector<std::string> local_addresses, std::string token,
                       std::string admin_token, int64_t heartbeat_ms, int64_t request_timeout_ms,
                       bool rejoin_after_eviction, bool join_waits_for_lease,
                       const std::string& curve_key_file) {
             directory::DirectoryClientOptions o;
             o.curve = CurveFromKeyFile(curve_key_file);
             o.directory = WithScheme(directory);
             o.token = std::move(token);
             o.admin_token = std::move(admin_token);
             o.heartbeat_ms = heartbeat_ms;
             o.request_timeout_ms = request_timeout_ms;
             o.rejoin_after_eviction = rejoin_after_eviction;
             o.join_waits_for_lease = join_waits_for_lease;
             std::optional<Lid> lid;
             if (model) {
               ThrowIfError(Lid::ValidateModel(*model));
               lid = Lid{*model, stage_idx, shard_idx, replica_idx};
             }
             return std::make_unique<PyDirectoryClient>(std::move(o), std::move(lid),
                                                        std::move(local_addresses));
           }),
           py::arg("directory"), py::arg("model") = py::none(), py::arg("stage_idx") = 0,
           py::arg("shard_idx") = 0, py::arg("replica_idx") = 0,
           py::arg("local_addresses") = std::vector<std::string>{}, py::kw_only(),
           py::arg("token") = "", py::arg("admin_token") = "", py::arg("heartbeat_ms") = 0,
           py::arg("request_timeout_ms") = 3000, py::arg("rejoin_after_eviction") = true,
           py::arg("join_waits_for_lease") = true, py::arg("curve_key_file") = "")
      .def("start", &PyDirectoryClient::Start,
           "Connects and says HELLO. connex.Unavailable / connex.DeadlineExceeded when no "
           "directory answers. Idempotent.")
      .def("connect", &PyDirectoryClient::Start, "Same as start().")
      .def("close", &PyDirectoryClient::Close,
           "Stops heartbeating (without leaving) and drops the callbacks.")
      .def("__enter__",
           [](py::object self) {
             self.cast<PyDirectoryClient&>().Start();
             return self;
           })
      .def("__exit__", [](PyDirectoryClient& c, py::args) { c.Close(); })
      .def_property_readonly(
          "lid", [](const PyDirectoryClient& c) { return c.lid(); },
          "This client's own LID (None without `model`).")
      .def_property_readonly("local_addresses", &PyDirectoryClient::local_addresses)
      // ---- the reference's holder API ----
      .def(
          "register",
          [](PyDirectoryClient& c, std::optional<std::vector<std::string>> addresses,
             std::map<std::string, std::string> metadata) {
            const Lid& lid = c.OwnLid("register");
            std::vector<std::string> a = addresses.value_or(c.local_addresses());
            auto client = c.Get();
            return ValueOrThrow(Blocking([&] { return client->Join(lid, a, metadata); }));
          },
          py::arg("addresses") = py::none(),
          py::arg("metadata") = std::map<std::string, std::string>{},
          "Joins this client's own LID at `addresses` (default: local_addresses) and returns the "
          "epoch. Registering again with other addresses is a migration (new epoch).")
      .def(
          "deregister",
          [](PyDirectoryClient& c) {
            const Lid& lid = c.OwnLid("deregister");
            auto client = c.Get();
            ThrowIfError(Blocking([&] { return client->Leave(lid); }));
          },
          "Leaves this client's own LID gracefully (LEFT).")
      // ---- holder side ----
      .def(
          "join",
          [](PyDirectoryClient& c, py::object lid, std::vector<std::string> addresses,
             std::map<std::string, std::string> metadata) {
            Lid l = ToLid(lid);
            auto client = c.Get();
            return ValueOrThrow(Blocking([&] { return client->Join(l, addresses, metadata); }));
          },
          py::arg("lid"), py::arg("addresses"),
          py::arg("metadata") = std::map<std::string, std::string>{},
          "Registers `lid` at `addresses`, keeps its lease alive and returns the epoch. "
          "connex.AlreadyExists when another live process holds it.")
      .def(
          "force_join",
          [](PyDirectoryClient& c, py::object lid, std::vector<std::string> addresses,
             std::map<std::string, std::string> metadata) {
            Lid l = ToLid(lid);
            auto client = c.Get();
            return ValueOrThrow(
                Blocking([&] { return client->ForceJoin(l, addresses, metadata); }));
          },
          py::arg("lid"), py::arg("addresses"),
          py::arg("metadata") = std::map<std::string, std::string>{},
          "An operator's takeover of a live LID (needs admin_token: connex.PermissionDenied).")
      .def(
          "leave",
          [](PyDirectoryClient& c, py::object lid) {
            Lid l = ToLid(lid);
            auto client = c.Get();
            ThrowIfError(Blocking([&] { return client->Leave(l); }));
          },
          py::arg("lid"), "Leaves gracefully (LEFT). connex.NotFound if not held here.")
      .def(
          "leave_all",
          [](PyDirectoryClient& c) {
            auto client = c.Get();
            ThrowIfError(Blocking([&] { return client->LeaveAll(); }));
          },
          "Leaves every LID this client holds.")
      .def(
          "renew",
          [](PyDirectoryClient& c, py::object lid) {
            Lid l = ToLid(lid);
            auto client = c.Get();
            return ValueOrThrow(Blocking([&] { return client->Renew(l); }));
          },
          py::arg("lid"),
          "Renews the lease now; returns the epoch the directory holds. connex.Fenced when it "
          "was evicted or superseded, connex.NotFound when not held here.")
      .def(
          "epoch_of",
          [](PyDirectoryClient& c, py::object lid) {
            Lid l = ToLid(lid);
            auto client = c.Get();
            return Blocking([&] { return client->EpochOf(l); });
          },
          py::arg("lid"), "The epoch this client holds `lid` under, or None.")
      .def("on_registration_change", &PyDirectoryClient::OnRegistrationChange, py::arg("callback"),
           "Calls callback(RegistrationChange) when a registration is rejoined or lost, on this "
           "client's callback thread (with the GIL); None removes it.")
      // ---- requests ----
      .def(
          "get_snapshot",
          [](PyDirectoryClient& c, std::optional<std::string> model,
             std::optional<uint32_t> group) {
            auto client = c.Get();
            return ValueOrThrow(Blocking([&] { return client->GetSnapshot(model, group); }));
          },
          py::arg("model") = py::none(), py::arg("group") = py::none(),
          "A consistent snapshot (of `model`, and `group`, if given) from the directory.")
      .def(
          "resolve",
          [](PyDirectoryClient& c, py::object lid) {
            Lid l = ToLid(lid);
            auto client = c.Get();
            Snapshot s =
                ValueOrThrow(Blocking([&] { return client->GetSnapshot(l.model, l.group); }));
            for (Record& r : s.records) {
              if (r.lid == l) return r;
            }
            RaiseStatus(absl::NotFoundError(StrCat("directory: no live record of ", l.ToString(),
                                                   " (", s.records.size(), " records in ", l.model,
                                                   "/g", l.group, ")")));
          },
          py::arg("lid"),
          "The live record of `lid` (its epoch and addresses) from the directory; "
          "connex.NotFound for an unknown LID.")
      .def(
          "report_failed",
          [](PyDirectoryClient& c, py::object lid, uint64_t epoch, std::string reporter) {
            Lid l = ToLid(lid);
            auto client = c.Get();
            return ValueOrThrow(Blocking([&] { return client->ReportFailed(l, epoch, reporter); }));
          },
          py::arg("lid"), py::arg("epoch") = 0, py::arg("reporter") = "",
          "Evicts (lid, epoch) for everyone (0: the current epoch); returns whether it was. Needs "
          "a live LID of the same model held here (connex.PermissionDenied).")
      .def(
          "evict",
          [](PyDirectoryClient& c, py::object lid) {
            Lid l = ToLid(lid);
            auto client = c.Get();
            ThrowIfError(Blocking([&] { return client->Evict(l); }));
          },
          py::arg("lid"), "An operator's drain (needs admin_token).")
      // ---- watcher side ----
      .def(
          "watch",
          [](PyDirectoryClient& c, std::string model) {
            auto client = c.Get();
            ThrowIfError(Blocking([&] { return client->Watch(model); }));
          },
          py::arg("model") = "",
          "Watches `model` ('' = every model): subscribes to its events and takes its first "
          "snapshot before returning.")
      .def(
          "view",
          [](PyDirectoryClient& c, std::string model, std::optional<uint32_t> group) {
            auto client = c.Get();
            return Blocking([&] { return client->View(model, group); });
          },
          py::arg("model"), py::arg("group") = py::none(),
          "The watched records of `model` (and `group`), sorted by LID.")
      .def(
          "await_view",
          [](PyDirectoryClient& c, std::string model, size_t count, double timeout) {
            auto client = c.Get();
            return Blocking([&] {
              return client->AwaitView(
                  model, [count](const std::vector<Record>& v) { return v.size() >= count; },
                  static_cast<int64_t>(timeout * 1000));
            });
          },
          py::arg("model"), py::arg("count"), py::arg("timeout") = 5.0,
          "Waits until the view of `model` has at least `count` records; returns whether it did "
          "within `timeout` seconds.")
      .def("subscribe", &PyDirectoryClient::Subscribe, py::arg("callback"),
           "Calls callback(Event) for every event applied to the view, in revision order, on this "
           "client's callback thread (with the GIL), never on the thread that heartbeats: a slow "
           "callback delays later callbacks only, and may call the client's methods. Returns an "
           "id for unsubscribe(); exceptions go to sys.unraisablehook.")
      .def("unsubscribe", &PyDirectoryClient::Unsubscribe, py::arg("id"))
      .def(
          "events",
          [](PyDirectoryClient& c, std::optional<std::string> model) {
            return std::make_unique<PyEventStream>(c, std::move(model));
          },
          py::arg("model") = py::none(), py::keep_alive<0, 1>(),
          "An EventStream of the events applied to the view from now on (of `model` only, if "
          "given). Call watch() for the models you want events of.")
      .def_property_readonly("view_revision",
                             [](PyDirectoryClient& c) {
                               auto client = c.Get();
                               return Blocking([&] { return client->view_revision(); });
                             })
      .def_property_readonly("resnapshots",
                             [](PyDirectoryClient& c) {
                               auto client = c.Get();
                               return Blocking([&] { return client->resnapshots(); });
                             })
      .def_property_readonly("events_received",
                             [](PyDirectoryClient& c) {
                               auto client = c.Get();
                               return Blocking([&] { return client->events_received(); });
                             })
      .def_property_readonly("pub_address",
                             [](PyDirectoryClient& c) { return c.Get()->pub_address(); })
      .def_property_readonly("directory_address",
                             [](PyDirectoryClient& c) { return c.Get()->directory_address(); })
      .def_property_readonly("lease_ttl_ms",
                             [](PyDirectoryClient& c) {
                               auto client = c.Get();
                               return Blocking([&] { return client->lease_ttl_ms(); });
                             })
      .def_property_readonly("heartbeat_ms", [](PyDirectoryClient& c) {
        auto client = c.Get();
        return Blocking([&] { return client->heartbeat_ms(); });
      });
}

transport::PeerRef ToPeerRef(py::handle value) {
  if (py::isinstance<transport::PeerRef>(value)) return value.cast<transport::PeerRef>();
  if (py::isinstance<Record>(value)) {
    const Record& r = value.cast<const Record&>();
    return transport::PeerRef{r.lid, r.addresses};
  }
  if (py::isinstance<py::tuple>(value) && py::len(value) == 2) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(value);
    try {
      return transport::PeerRef{ToLid(t[0], "peer"), t[1].cast<std::vector<std::string>>()};
    } catch (py::cast_error&) {
      throw py::type_error("peer: the addresses (second item) must be a list of str");
    }
  }
  throw py::type_error(
      StrCat("peer: expected a connex.PeerRef, a directory Record or a (lid, [addresses]) "
             "pair, not ",
             std::string(py::str(py::type::handle_of(value).attr("__name__")))));
}

}  // namespace connex::python

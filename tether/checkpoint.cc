#include "tether/checkpoint.h"

#include <ATen/core/function.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "core/ivalue_future.h"
#include "core/native_function.h"
#include "core/rpc.h"
#include "rref/module_state.h"
#include "tether/internal/checkpoint_files.h"

namespace tether {
namespace {

// What a member asks an owner to run (serve_checkpoints registers them).
constexpr char kWritePart[] = "tether::checkpoint_write_part";
constexpr char kReadPart[] = "tether::checkpoint_read_part";

// The directories this process serves, normalized.
struct Served {
  absl::Mutex mu;
  absl::flat_hash_set<std::string> dirs ABSL_GUARDED_BY(mu);
};

Served& served() {
  static auto* served = new Served();  // never destroyed
  return *served;
}

absl::Status check_served(const std::string& dir) {
  Served& s = served();
  absl::MutexLock lock(&s.mu);
  if (!s.dirs.contains(internal::normal_directory(dir))) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this worker serves no checkpoints in '", dir,
        "': its program calls tether::serve_checkpoints(\"", dir, "\")"));
  }
  return absl::OkStatus();
}

// Runs `f`, whose code may be the user's: an exception it throws is its
// error (a StatusError's with its code).
template <typename F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const StatusError& e) {
    return e.status();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return absl::UnknownError(e.what());
  }
}

// Runs `method` of a custom class object.
absl::StatusOr<c10::IValue> call_method(const c10::IValue& object,
                                        const std::string& method,
                                        std::vector<c10::IValue> args) {
  torch::jit::Function* fn = object.toObjectRef().type()->findMethod(method);
  if (fn == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("it holds a ", object.type()->str(), ", which has no ",
                     method, "() method"));
  }
  std::vector<c10::IValue> stack = {object};
  for (c10::IValue& arg : args) stack.push_back(std::move(arg));
  return guarded([&]() -> absl::StatusOr<c10::IValue> {
    fn->getSchema().checkAndNormalizeInputs(stack);
    fn->run(stack);
    return stack.empty() ? c10::IValue() : stack.back();
  });
}

// The state of the object an owner holds: a tensor's values, else what
// its state_dict() returns.
absl::StatusOr<c10::IValue> state_of(const c10::IValue& value) {
  if (value.isTensor()) return c10::IValue(value.toTensor().detach());
  if (value.isObject()) return call_method(value, "state_dict", {});
  return absl::InvalidArgumentError(
      absl::StrCat("it holds a ", value.type()->str(),
                   ", neither a tensor nor an object with state_dict()"));
}

absl::Status copy_into(const at::Tensor& target, const c10::IValue& state) {
  if (!state.isTensor()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint holds a ", state.type()->str(), ", not a tensor"));
  }
  const at::Tensor& saved = state.toTensor();
  if (!saved.sizes().equals(target.sizes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint's tensor is [", absl::StrJoin(saved.sizes(), ", "),
        "], this one [", absl::StrJoin(target.sizes(), ", "), "]"));
  }
  at::NoGradGuard no_grad;
  target.detach().copy_(saved);
  return absl::OkStatus();
}

absl::Status load_into(const c10::IValue& value, const c10::IValue& state) {
  if (value.isTensor()) return copy_into(value.toTensor(), state);
  if (value.isObject()) {
    return call_method(value, "load_state_dict", {state}).status();
  }
  return state_of(value).status();  // says why it cannot be
}

absl::Status in_item(absl::string_view name, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("item '", name, "': ", status.message()));
}

// `items`: {name: RRef} of objects this worker owns.
absl::StatusOr<std::vector<std::pair<std::string, c10::IValue>>> owned(
    const c10::IValue& items) {
  if (!items.isGenericDict()) {
    return absl::InvalidArgumentError("the items must be a dict of RRefs");
  }
  std::vector<std::pair<std::string, c10::IValue>> out;
  for (const auto& entry : items.toGenericDict()) {
    if (!entry.key().isString()) {
      return absl::InvalidArgumentError("the items must be named by strings");
    }
    const std::string name = entry.key().toStringRef();
    absl::StatusOr<RRef> rref = RRef::from_ivalue(entry.value());
    if (!rref.ok()) return in_item(name, rref.status());
    absl::StatusOr<c10::IValue> value = rref->local_value();
    if (!value.ok()) return in_item(name, value.status());
    out.emplace_back(name, *std::move(value));
  }
  return out;
}

absl::StatusOr<int64_t> write_pickle(const std::string& path,
                                     const c10::IValue& value) {
  std::vector<char> bytes;
  try {
    bytes = torch::jit::pickle_save(value);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pickle '", path, "': ", e.what()));
  }
  if (absl::Status written = internal::write_file_atomically(
          path, absl::string_view(bytes.data(), bytes.size()));
      !written.ok()) {
    return written;
  }
  return static_cast<int64_t>(bytes.size());
}

// The {name: state} dict of a part, checked against the size its marker
// lists.
absl::StatusOr<c10::impl::GenericDict> read_pickle(const std::string& path,
                                                   int64_t bytes) {
  absl::StatusOr<std::string> data = internal::read_file(path);
  if (!data.ok()) return data.status();
  if (static_cast<int64_t>(data->size()) != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is ", data->size(),
                     " bytes, the checkpoint's marker lists ", bytes));
  }
  c10::IValue value;
  try {
    value =
        torch::jit::pickle_load(std::vector<char>(data->begin(), data->end()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot unpickle '", path, "': ", e.what()));
  }
  if (!value.isGenericDict()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' holds no dict of items"));
  }
  return value.toGenericDict();
}

absl::StatusOr<c10::IValue> find_item(const c10::impl::GenericDict& part,
                                      const std::string& name,
                                      const std::string& path) {
  auto it = part.find(name);
  if (it == part.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' has no item '", name, "'"));
  }
  return it->value();
}

// The path, on the owner serving this call, of `member`'s part of `step`.
absl::StatusOr<std::string> owner_part(const std::string& dir, int64_t step,
                                       const std::string& member) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a checkpoint's step is 0 or more, not ", step));
  }
  Worker* worker = Worker::serving();
  if (worker == nullptr) {
    return absl::InternalError("a checkpoint's part is written as an RPC");
  }
  return absl::StrCat(
      internal::step_directory(dir, step), "/",
      internal::part_file(worker->get_current_worker_info().name, member));
}

// On an owner: writes the state of `items` as `member`'s part of `step`.
absl::StatusOr<int64_t> write_part(const std::string& dir, int64_t step,
                                   const std::string& member,
                                   const c10::IValue& items) {
  if (absl::Status ok = check_served(dir); !ok.ok()) return ok;
  absl::StatusOr<std::string> path = owner_part(dir, step, member);
  if (!path.ok()) return path.status();
  absl::StatusOr<std::vector<std::pair<std::string, c10::IValue>>> objects =
      owned(items);
  if (!objects.ok()) return objects.status();
  c10::impl::GenericDict part(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [name, value] : *objects) {
    absl::StatusOr<c10::IValue> state = state_of(value);
    if (!state.ok()) return in_item(name, state.status());
    part.insert(name, *std::move(state));
  }
  if (absl::Status made =
          internal::make_directories(internal::step_directory(dir, step));
      !made.ok()) {
    return made;
  }
  return write_pickle(*path, part);
}

// On an owner: loads `member`'s part of `step` into `items`.
absl::Status read_part(const std::string& dir, int64_t step,
                       const std::string& member, int64_t bytes,
                       const c10::IValue& items) {
  if (absl::Status ok = check_served(dir); !ok.ok()) return ok;
  absl::StatusOr<std::vector<std::pair<std::string, c10::IValue>>> objects =
      owned(items);
  if (!objects.ok()) return objects.status();
  absl::StatusOr<std::string> path = owner_part(dir, step, member);
  if (!path.ok()) return path.status();
  absl::StatusOr<c10::impl::GenericDict> part = read_pickle(*path, bytes);
  if (!part.ok()) return part.status();
  for (const auto& [name, value] : *objects) {
    absl::StatusOr<c10::IValue> state = find_item(*part, name, *path);
    if (!state.ok()) return state.status();
    if (absl::Status loaded = load_into(value, *state); !loaded.ok()) {
      return in_item(name, loaded);
    }
  }
  return absl::OkStatus();
}

absl::Status register_functions() {
  static absl::Status* registered = [] {
    auto* status = new absl::Status(register_function(kWritePart, write_part));
    if (status->ok()) *status = register_function(kReadPart, read_part);
    return status;
  }();
  return *registered;
}

c10::IValue status_value(const absl::Status& status, c10::IValue payload) {
  return c10::ivalue::Tuple::create({static_cast<int64_t>(status.code()),
                                     std::string(status.message()),
                                     std::move(payload)});
}

absl::Status status_from(const std::string& member, const c10::IValue& v) {
  const auto& elements = v.toTupleRef().elements();
  const auto code = static_cast<absl::StatusCode>(elements[0].toInt());
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(code, absl::StrCat("checkpoint member ", member, ": ",
                                         elements[1].toStringRef()));
}

c10::Dict<std::string, int64_t> to_dict(
    const std::map<std::string, int64_t>& files) {
  c10::Dict<std::string, int64_t> out;
  for (const auto& [file, bytes] : files) out.insert(file, bytes);
  return out;
}

std::map<std::string, int64_t> from_dict(const c10::IValue& v) {
  std::map<std::string, int64_t> out;
  for (const auto& entry : v.toGenericDict()) {
    out[entry.key().toStringRef()] = entry.value().toInt();
  }
  return out;
}

// The marker of `dir`'s highest complete step (step -1 if none), once the
// directories of later steps, incomplete ones, are removed.
absl::StatusOr<internal::Manifest> latest_manifest(const std::string& dir) {
  absl::StatusOr<internal::Steps> steps = internal::list_steps(dir);
  if (!steps.ok()) return steps.status();
  internal::Manifest manifest;
  manifest.step = -1;
  if (!steps->complete.empty()) {
    const int64_t step = steps->complete.back();
    const std::string marker = absl::StrCat(internal::step_directory(dir, step),
                                            "/", internal::kCompleteMarker);
    absl::StatusOr<std::string> text = internal::read_file(marker);
    if (!text.ok()) return text.status();
    absl::StatusOr<internal::Manifest> parsed =
        internal::parse_manifest(*text, marker);
    if (!parsed.ok()) return parsed.status();
    if (parsed->step != step) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", marker, "' names step ", parsed->step));
    }
    manifest = *std::move(parsed);
  }
  for (int64_t later : steps->all) {
    if (later <= manifest.step) continue;
    if (absl::Status removed = internal::remove_step_directory(
            internal::step_directory(dir, later));
        !removed.ok()) {
      return removed;
    }
  }
  return manifest;
}

}  // namespace

absl::Status serve_checkpoints(const std::string& dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("a checkpoint directory cannot be empty");
  }
  if (absl::Status registered = register_functions(); !registered.ok()) {
    return registered;
  }
  Served& s = served();
  absl::MutexLock lock(&s.mu);
  s.dirs.insert(internal::normal_directory(dir));
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> Checkpoint::create(Worker& worker,
                                              CheckpointOptions options) {
  if (options.keep < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep must be 0 or more, not ", options.keep));
  }
  if (absl::Status served = serve_checkpoints(options.dir); !served.ok()) {
    return served;
  }
  const std::string& self = worker.get_current_worker_info().name;
  std::vector<std::string> members = options.members;
  if (members.empty()) members.push_back(self);
  std::sort(members.begin(), members.end());
  if (std::adjacent_find(members.begin(), members.end()) != members.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the members name a worker twice: ",
                     absl::StrJoin(options.members, ", ")));
  }
  if (!std::binary_search(members.begin(), members.end(), self)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the members (", absl::StrJoin(members, ", "),
                     ") leave out ", self, ", which makes the checkpoint"));
  }
  for (const std::string& member : members) {
    if (absl::StatusOr<WorkerInfo> known = worker.get_worker_info(member);
        !known.ok()) {
      return known.status();
    }
  }
  return Checkpoint(worker, std::move(options), std::move(members));
}

absl::StatusOr<Checkpoint> Checkpoint::create(CheckpointOptions options) {
  Worker* worker = current_worker();
  if (worker == nullptr) {
    return absl::FailedPreconditionError(
        "no RPC worker: call tether::init_rpc() first");
  }
  return create(*worker, std::move(options));
}

const std::string& Checkpoint::self() const {
  return worker_->get_current_worker_info().name;
}

absl::Status Checkpoint::take_name(const std::string& name) {
  if (name.empty()) {
    return absl::InvalidArgumentError("a checkpoint item needs a name");
  }
  if (!names_.insert(name).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("the checkpoint has an item '", name, "' already"));
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::add_local(const std::string& name, LocalItem item) {
  if (absl::Status taken = take_name(name); !taken.ok()) return taken;
  item.name = name;
  local_.push_back(std::move(item));
  return absl::OkStatus();
}

absl::Status Checkpoint::add_module(const std::string& name,
                                    std::shared_ptr<torch::nn::Module> module) {
  if (module == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("item '", name, "': the module is null"));
  }
  LocalItem item;
  item.save = [module]() -> absl::StatusOr<c10::IValue> {
    return c10::IValue(module_state_dict(*module));
  };
  item.load = [module](const c10::IValue& state) -> absl::Status {
    if (!state.isGenericDict()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint holds a ", state.type()->str(), ", not a module's"));
    }
    c10::Dict<std::string, at::Tensor> tensors;
    for (const auto& entry : state.toGenericDict()) {
      if (!entry.key().isString() || !entry.value().isTensor()) {
        return absl::InvalidArgumentError(
            "the checkpoint's module state is not a dict of tensors");
      }
      tensors.insert(entry.key().toStringRef(), entry.value().toTensor());
    }
    return load_module_state_dict(*module, tensors);
  };
  return add_local(name, std::move(item));
}

absl::Status Checkpoint::add_tensor(const std::string& name,
                                    at::Tensor tensor) {
  LocalItem item;
  item.save = [tensor]() -> absl::StatusOr<c10::IValue> {
    return c10::IValue(tensor.detach());
  };
  item.load = [tensor](const c10::IValue& state) {
    return copy_into(tensor, state);
  };
  return add_local(name, std::move(item));
}

absl::Status Checkpoint::add_generator(const std::string& name,
                                       at::Generator generator) {
  LocalItem item;
  item.save = [generator]() mutable -> absl::StatusOr<c10::IValue> {
    std::lock_guard<std::mutex> lock(generator.mutex());
    return c10::IValue(generator.get_state());
  };
  item.load = [generator](const c10::IValue& state) mutable -> absl::Status {
    if (!state.isTensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint holds a ", state.type()->str(),
                       ", not a generator's state"));
    }
    try {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state.toTensor());
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(e.what_without_backtrace());
    }
    return absl::OkStatus();
  };
  return add_local(name, std::move(item));
}

absl::Status Checkpoint::add_value(
    const std::string& name, std::function<c10::IValue()> save,
    std::function<absl::Status(const c10::IValue&)> load) {
  if (!save || !load) {
    return absl::InvalidArgumentError(
        absl::StrCat("item '", name, "' needs both its save and its load"));
  }
  LocalItem item;
  item.save = [save = std::move(save)]() -> absl::StatusOr<c10::IValue> {
    return save();
  };
  item.load = std::move(load);
  return add_local(name, std::move(item));
}

absl::Status Checkpoint::add_remote(const std::string& name, RRef object) {
  if (!object.valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("item '", name, "': the RRef is empty"));
  }
  if (absl::Status taken = take_name(name); !taken.ok()) return taken;
  remote_.push_back({name, std::move(object)});
  return absl::OkStatus();
}

absl::Status Checkpoint::add_optimizer(
    const std::string& name, const optim::DistributedOptimizer& optimizer) {
  if (absl::Status taken = take_name(name); !taken.ok()) return taken;
  // One optimizer per owner: the name is unique within each owner's part.
  for (const RRef& owner : optimizer.local_optimizers()) {
    remote_.push_back({name, owner});
  }
  return absl::OkStatus();
}

std::map<std::string, c10::impl::GenericDict> Checkpoint::remote_by_owner()
    const {
  std::map<std::string, c10::impl::GenericDict> out;
  for (const RemoteItem& item : remote_) {
    const std::string owner = item.object.owner_name();
    if (owner == self()) continue;
    auto it = out.find(owner);
    if (it == out.end()) {
      it = out.emplace(owner, c10::impl::GenericDict(c10::StringType::get(),
                                                     c10::AnyType::get()))
               .first;
    }
    it->second.insert(item.name, item.object.to_ivalue());
  }
  return out;
}

absl::Status Checkpoint::write_parts(int64_t step,
                                     std::map<std::string, int64_t>& files) {
  const std::string step_dir = internal::step_directory(dir_, step);
  if (absl::Status made = internal::make_directories(step_dir); !made.ok()) {
    return made;
  }
  // The owners write while this member writes its own.
  std::map<std::string, c10::impl::GenericDict> by_owner = remote_by_owner();
  std::vector<std::pair<std::string, Future<c10::IValue>>> writes;
  for (auto& [owner, items] : by_owner) {
    writes.emplace_back(
        owner, worker_->rpc_async(owner, kWritePart,
                                  {dir_, step, self(), std::move(items)}, {},
                                  options_.timeout));
  }
  c10::impl::GenericDict own(c10::StringType::get(), c10::AnyType::get());
  absl::Status status = absl::OkStatus();
  for (const LocalItem& item : local_) {
    absl::StatusOr<c10::IValue> state = guarded(item.save);
    if (!state.ok()) {
      status = in_item(item.name, state.status());
      break;
    }
    own.insert(item.name, *std::move(state));
  }
  for (const RemoteItem& item : remote_) {
    if (!status.ok() || item.object.owner_name() != self()) continue;
    absl::StatusOr<c10::IValue> value = item.object.local_value();
    absl::StatusOr<c10::IValue> state =
        value.ok() ? state_of(*value) : value.status();
    if (!state.ok()) {
      status = in_item(item.name, state.status());
    } else {
      own.insert(item.name, *std::move(state));
    }
  }
  if (status.ok()) {
    const std::string file = internal::part_file(self(), self());
    absl::StatusOr<int64_t> bytes =
        write_pickle(absl::StrCat(step_dir, "/", file), own);
    if (bytes.ok()) {
      files[file] = *bytes;
    } else {
      status = bytes.status();
    }
  }
  for (auto& [owner, write] : writes) {
    absl::StatusOr<c10::IValue> bytes = write.get();
    if (bytes.ok()) {
      files[internal::part_file(owner, self())] = bytes->toInt();
    } else if (status.ok()) {
      status = bytes.status();
    }
  }
  return status;
}

absl::Status Checkpoint::read_parts(
    int64_t step, const std::map<std::string, int64_t>& files) {
  const std::string step_dir = internal::step_directory(dir_, step);
  auto listed = [&](const std::string& file) -> absl::StatusOr<int64_t> {
    auto it = files.find(file);
    if (it == files.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint of step ", step, " has no part '", file, "'"));
    }
    return it->second;
  };
  std::map<std::string, c10::impl::GenericDict> by_owner = remote_by_owner();
  std::vector<Future<c10::IValue>> reads;
  absl::Status status = absl::OkStatus();
  for (auto& [owner, items] : by_owner) {
    absl::StatusOr<int64_t> bytes = listed(internal::part_file(owner, self()));
    if (!bytes.ok()) {
      status = bytes.status();
      break;
    }
    reads.push_back(worker_->rpc_async(
        owner, kReadPart, {dir_, step, self(), *bytes, std::move(items)}, {},
        options_.timeout));
  }
  const std::string file = internal::part_file(self(), self());
  const std::string path = absl::StrCat(step_dir, "/", file);
  absl::StatusOr<int64_t> bytes = listed(file);
  absl::StatusOr<c10::impl::GenericDict> own =
      bytes.ok() ? read_pickle(path, *bytes)
                 : absl::StatusOr<c10::impl::GenericDict>(bytes.status());
  if (status.ok() && !own.ok()) status = own.status();
  for (const LocalItem& item : local_) {
    if (!status.ok()) break;
    absl::StatusOr<c10::IValue> state = find_item(*own, item.name, path);
    status = state.ok() ? in_item(item.name,
                                  guarded([&] { return item.load(*state); }))
                        : state.status();
  }
  for (const RemoteItem& item : remote_) {
    if (!status.ok() || item.object.owner_name() != self()) continue;
    absl::StatusOr<c10::IValue> state = find_item(*own, item.name, path);
    absl::StatusOr<c10::IValue> value = item.object.local_value();
    if (!state.ok()) {
      status = state.status();
    } else if (!value.ok()) {
      status = in_item(item.name, value.status());
    } else {
      status = in_item(item.name, load_into(*value, *state));
    }
  }
  for (Future<c10::IValue>& read : reads) {
    absl::StatusOr<c10::IValue> done = read.get();
    if (!done.ok() && status.ok()) status = done.status();
  }
  return status;
}

absl::StatusOr<std::map<std::string, c10::IValue>> Checkpoint::gather(
    c10::IValue mine) {
  if (members_.size() == 1)
    return std::map<std::string, c10::IValue>{{self(), mine}};
  return worker_->all_gather(std::move(mine), members_);
}

absl::StatusOr<std::map<std::string, int64_t>> Checkpoint::exchange(
    const absl::Status& status, const std::map<std::string, int64_t>& files) {
  absl::StatusOr<std::map<std::string, c10::IValue>> all =
      gather(status_value(status, to_dict(files)));
  if (!all.ok()) return all.status();
  std::map<std::string, int64_t> every;
  // A member's value that is not this shape throws: its error.
  absl::Status outcome = guarded([&]() -> absl::Status {
    for (const auto& [member, value] : *all) {  // in name order
      if (absl::Status failed = status_from(member, value); !failed.ok()) {
        return failed;
      }
      for (const auto& [file, bytes] :
           from_dict(value.toTupleRef().elements()[2])) {
        every[file] = bytes;
      }
    }
    return absl::OkStatus();
  });
  if (!outcome.ok()) return outcome;
  return every;
}

absl::StatusOr<SavedCheckpoint> Checkpoint::save(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a checkpoint's step is 0 or more, not ", step));
  }
  // Every member is at `step` before an owner writes: another member's
  // step could still change what the owner holds.
  if (members_.size() > 1) {
    if (absl::Status met = worker_->barrier(members_); !met.ok()) return met;
  }
  const absl::Time start = absl::Now();
  std::map<std::string, int64_t> files;
  const absl::Status wrote = write_parts(step, files);
  absl::StatusOr<std::map<std::string, int64_t>> every = exchange(wrote, files);
  if (!every.ok()) return every.status();
  SavedCheckpoint saved;
  saved.step = step;
  saved.path = internal::step_directory(dir_, step);
  saved.files = static_cast<int64_t>(every->size());
  for (const auto& [file, bytes] : *every) saved.bytes += bytes;
  if (coordinator()) {
    internal::Manifest manifest;
    manifest.step = step;
    manifest.members = members_;
    manifest.files = *every;
    if (absl::Status marked = internal::write_file_atomically(
            absl::StrCat(saved.path, "/", internal::kCompleteMarker),
            internal::format_manifest(manifest));
        !marked.ok()) {
      return marked;
    }
    if (absl::Status pruned = prune(); !pruned.ok()) return pruned;
  }
  saved.took = absl::Now() - start;
  return saved;
}

absl::Status Checkpoint::prune() {
  if (options_.keep == 0) return absl::OkStatus();
  absl::StatusOr<internal::Steps> steps = internal::list_steps(dir_);
  if (!steps.ok()) return steps.status();
  const std::vector<int64_t>& complete = steps->complete;
  const size_t keep = static_cast<size_t>(options_.keep);
  for (size_t i = 0; i + keep < complete.size(); ++i) {
    if (absl::Status removed = internal::remove_step_directory(
            internal::step_directory(dir_, complete[i]));
        !removed.ok()) {
      return removed;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> Checkpoint::latest(
    const std::string& dir) {
  absl::StatusOr<internal::Steps> steps = internal::list_steps(dir);
  if (!steps.ok()) return steps.status();
  if (steps->complete.empty()) return std::nullopt;
  return steps->complete.back();
}

absl::StatusOr<std::optional<int64_t>> Checkpoint::load() {
  // The coordinator picks the step (and drops the incomplete ones after
  // it); every member learns it with the manifest.
  absl::StatusOr<internal::Manifest> manifest = internal::Manifest{-1, {}, {}};
  if (coordinator()) manifest = latest_manifest(dir_);
  const absl::Status found = manifest.status();
  if (!found.ok()) manifest = internal::Manifest{-1, {}, {}};
  c10::impl::GenericList members(c10::StringType::get());
  for (const std::string& m : manifest->members) members.push_back(m);
  absl::StatusOr<std::map<std::string, c10::IValue>> all = gather(status_value(
      found, c10::ivalue::Tuple::create({manifest->step, std::move(members),
                                         to_dict(manifest->files)})));
  if (!all.ok()) return all.status();
  const std::string& lead = members_.front();
  int64_t step = -1;
  std::vector<std::string> saved_by;
  std::map<std::string, int64_t> files;
  // The lead's value that is not this shape throws: its error.
  absl::Status chosen = guarded([&]() -> absl::Status {
    if (absl::Status failed = status_from(lead, all->at(lead)); !failed.ok()) {
      return failed;
    }
    const auto& manifest =
        all->at(lead).toTupleRef().elements()[2].toTupleRef().elements();
    step = manifest[0].toInt();
    for (const c10::IValue& m : manifest[1].toListRef()) {
      saved_by.push_back(m.toStringRef());
    }
    files = from_dict(manifest[2]);
    return absl::OkStatus();
  });
  if (!chosen.ok()) return chosen;
  if (step < 0) return std::nullopt;
  absl::Status status = absl::OkStatus();
  if (saved_by != members_) {
    status = absl::InvalidArgumentError(
        absl::StrCat("the checkpoint of step ", step, " was saved by ",
                     absl::StrJoin(saved_by, ", "), "; this job's members are ",
                     absl::StrJoin(members_, ", ")));
  }
  if (status.ok()) status = read_parts(step, files);
  // Every member loaded before any trains on: the exchange is the barrier.
  absl::StatusOr<std::map<std::string, int64_t>> every = exchange(status, {});
  if (!every.ok()) return every.status();
  return step;
}

}  // namespace tether

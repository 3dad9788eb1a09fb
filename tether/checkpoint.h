// tether/checkpoint.h: checkpoints of a job whose state is spread over its
// workers, and resuming from the last complete one: what torchrun users
// write by hand with torch.save, with the files written atomically and a
// checkpoint loaded only once every worker's part of it was written.
//
// A trainer holds its local modules, its data position and its random
// generators; a parameter server holds the modules trainers reach through
// RRefs, and the optimizers a DistributedOptimizer built there. A
// Checkpoint is what one worker, a member, saves: items it adds by name.
// Each item is written by the worker that holds it, so no state crosses the
// network to be saved: the member's own items into its file, an RRef's
// object or an owner's share of a DistributedOptimizer by that owner, into
// a file of its own.
//
//   tether::CheckpointOptions options;
//   options.dir = "ckpt";
//   options.members = {"trainer1", "trainer2"};  // the workers that save
//   TETHER_ASSIGN_OR_RETURN(tether::Checkpoint checkpoint,
//                           tether::Checkpoint::create(options));
//   TETHER_RETURN_IF_ERROR(checkpoint.add_module("lstm", lstm.ptr()));
//   TETHER_RETURN_IF_ERROR(checkpoint.add_remote("decoder", decoder_rref));
//   TETHER_RETURN_IF_ERROR(checkpoint.add_optimizer("optimizer", optimizer));
//   TETHER_RETURN_IF_ERROR(checkpoint.add_generator(
//       "rng", at::detail::getDefaultCPUGenerator()));
//   TETHER_ASSIGN_OR_RETURN(std::optional<int64_t> resumed, checkpoint.load());
//   for (int64_t step = resumed.value_or(0) + 1; step <= steps; ++step) {
//     ...  // train
//     if (step % every == 0)
//     TETHER_RETURN_IF_ERROR(checkpoint.save(step).status());
//   }
//
// The files, in `dir`, one directory per step:
//
//   step-00000040/trainer1.pt          trainer1's own items
//   step-00000040/ps.for-trainer1.pt   the items of trainer1 that ps holds
//   step-00000040/COMPLETE             the members, every file and its size
//
// Each file is written under a temporary name in its directory, fsynced,
// renamed, and the directory fsynced: it is there whole or not at all. A
// step is complete once its COMPLETE is there, which the coordinator (the
// first member by name) writes last, after every member has reported its
// files and its owners' written. load() takes the highest complete step: a
// step without the marker (a job killed while saving) is never loaded, and
// load() removes such directories newer than the one it loads. Parts are
// LibTorch pickles of {item name: state} (torch::jit::pickle_save), which
// Python's torch.load reads.
//
// `dir` names the same directory on every worker: a shared one (NFS), or
// each host's own, since every file is read back by the worker that wrote
// it (but `keep` prunes the coordinator's only). A worker writes and reads
// parts for its peers only in the directories it serves
// (serve_checkpoints; a member serves its own).
//
// Thread safety: save() and load() are collective over the members: each
// member calls them in the same order (and in the same order with its
// other collectives over the same members, Worker::all_gather and
// barrier). A Checkpoint is used by one thread at a time.
#ifndef TETHER_TETHER_CHECKPOINT_H_
#define TETHER_TETHER_CHECKPOINT_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/worker.h"
#include "optim/optimizer.h"
#include "rref/rref.h"

namespace tether {

struct CheckpointOptions {
  // Where the checkpoints go, the same path on every worker.
  std::string dir;
  // The workers that save and load together, this one among them; empty:
  // this worker alone.
  std::vector<std::string> members;
  // How many complete checkpoints to keep, the newest; 0: every one. Older
  // ones go once a new one is complete.
  int keep = 0;
  // Bounds each owner's write or read of its part (kDefaultTimeout: the
  // worker's RPC timeout; zero: none).
  absl::Duration timeout = kDefaultTimeout;
};

// What save() wrote.
struct SavedCheckpoint {
  int64_t step = 0;
  std::string path;   // the step's directory
  int64_t files = 0;  // of every member and its owners
  int64_t bytes = 0;
  // From the moment every member had arrived until every part was written.
  absl::Duration took;
};

// Lets peers' Checkpoints write and read, in `dir`, the parts of the
// objects this process owns (a parameter server's modules, the optimizers
// DistributedOptimizers built here). Any process that owns objects a
// member saves calls it, for the members' `dir`; members need not.
// INVALID_ARGUMENT for an empty `dir`.
[[nodiscard]] absl::Status serve_checkpoints(const std::string& dir);

class Checkpoint {
 public:
  // The checkpoint of `worker` (or current_worker()): INVALID_ARGUMENT for
  // an empty dir, a negative keep, or members that leave this worker out
  // or name one twice; NOT_FOUND for a member the group does not have.
  [[nodiscard]] static absl::StatusOr<Checkpoint> create(
      Worker& worker, CheckpointOptions options);
  [[nodiscard]] static absl::StatusOr<Checkpoint> create(
      CheckpointOptions options);

  // The items, each under its own name (ALREADY_EXISTS for a name taken,
  // INVALID_ARGUMENT for an empty one). What they refer to must outlive the
  // Checkpoint; load() writes into it.

  // A local module's parameters and buffers (rref/module_state.h).
  [[nodiscard]] absl::Status add_module(
      const std::string& name, std::shared_ptr<torch::nn::Module> module);
  // A tensor's values (load() copies into it).
  [[nodiscard]] absl::Status add_tensor(const std::string& name,
                                        at::Tensor tensor);
  // A random generator's state (at::detail::getDefaultCPUGenerator() is
  // the one at::randn uses by default).
  [[nodiscard]] absl::Status add_generator(const std::string& name,
                                           at::Generator generator);
  // Anything else, e.g. a data position: `save` gives the value (any
  // IValue that pickles), `load` takes it back.
  [[nodiscard]] absl::Status add_value(
      const std::string& name, std::function<c10::IValue()> save,
      std::function<absl::Status(const c10::IValue&)> load);
  // The object an RRef holds, saved by its owner: a tensor, or an object
  // with state_dict() and load_state_dict(state) methods (a custom class,
  // a RemoteModule's module_rref()).
  [[nodiscard]] absl::Status add_remote(const std::string& name, RRef object);
  // The optimizer state of every owner of `optimizer`'s parameters, each
  // saved by its owner.
  [[nodiscard]] absl::Status add_optimizer(
      const std::string& name, const optim::DistributedOptimizer& optimizer);

  // Saves every member's items as checkpoint `step`; returns once every
  // member's parts are written, with what all of them wrote. Every member
  // gets the first member's error (in name order) if one failed, and the
  // checkpoint is then not complete. The coordinator writes the marker
  // once the others have reported, before its own save() returns.
  [[nodiscard]] absl::StatusOr<SavedCheckpoint> save(int64_t step);

  // Loads the highest complete checkpoint of `dir` into every member's
  // items and returns its step, or nullopt if there is none (nothing
  // loaded). Every member returns once every member has loaded. Errors
  // (every member gets the first): INVALID_ARGUMENT when the checkpoint
  // was saved by other members, lacks an item, or a file's size is not
  // the one its marker lists; a file's errno as its code.
  [[nodiscard]] absl::StatusOr<std::optional<int64_t>> load();

  // The highest complete step in `dir`, or nullopt.
  [[nodiscard]] static absl::StatusOr<std::optional<int64_t>> latest(
      const std::string& dir);

  const std::string& dir() const { return dir_; }

 private:
  struct LocalItem {
    std::string name;
    std::function<absl::StatusOr<c10::IValue>()> save;
    std::function<absl::Status(const c10::IValue&)> load;
  };
  struct RemoteItem {
    std::string name;
    RRef object;
  };

  Checkpoint(Worker& worker, CheckpointOptions options,
             std::vector<std::string> members)
      : worker_(&worker),
        options_(std::move(options)),
        dir_(options_.dir),
        members_(std::move(members)) {}

  [[nodiscard]] absl::Status take_name(const std::string& name);
  [[nodiscard]] absl::Status add_local(const std::string& name, LocalItem item);
  const std::string& self() const;
  bool coordinator() const { return members_.front() == self(); }

  // The items other workers own, {name: RRef} by owner.
  std::map<std::string, c10::impl::GenericDict> remote_by_owner() const;
  // This member's part and its owners', into `step`'s directory; the files
  // written and their sizes into `files`.
  [[nodiscard]] absl::Status write_parts(int64_t step,
                                         std::map<std::string, int64_t>& files);
  [[nodiscard]] absl::Status read_parts(
      int64_t step, const std::map<std::string, int64_t>& files);
  // Every member's `mine`, by name (Worker::all_gather over the members).
  [[nodiscard]] absl::StatusOr<std::map<std::string, c10::IValue>> gather(
      c10::IValue mine);
  // Every member's status (and what it wrote) to every member: the first
  // error in name order, naming its member.
  [[nodiscard]] absl::StatusOr<std::map<std::string, int64_t>> exchange(
      const absl::Status& status, const std::map<std::string, int64_t>& files);
  [[nodiscard]] absl::Status prune();

  Worker* worker_;  // not owned
  CheckpointOptions options_;
  std::string dir_;
  std::vector<std::string> members_;  // sorted
  std::set<std::string> names_;
  std::vector<LocalItem> local_;
  std::vector<RemoteItem> remote_;
};

}  // namespace tether

#endif  // TETHER_TETHER_CHECKPOINT_H_

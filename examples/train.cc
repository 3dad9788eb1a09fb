// The main job: model-parallel training across worker processes.
//
// Run by the launcher, which sets RANK, WORLD_SIZE and MASTER_ADDR/PORT:
//
//   bazel run //examples:run_training -- --nproc 3 [--steps=200] ...
//
// Rank 0 is the parameter server ("ps"): it holds the embedding table and the
// decoder of the model in examples/ps_model.h. Every other rank is a trainer
// ("trainer1", ...) that runs the LSTM in the middle locally; its forward
// pass goes through RRef proxies to the parameter server, its backward
// through distributed autograd, its updates through a DistributedOptimizer.
// With two or more trainers they train the shared embedding and decoder
// concurrently. Each trainer shows progress (step, loss, steps per second)
// and a summary; with a single trainer it also trains the same model in
// this process with plain LibTorch and checks that every step's loss is the
// same. Exits non-zero if training fails, the loss does not go down, or the
// check does not hold.
//
// Flags: --steps=N (200), --backend=NAME (tensorpipe), --world_size=N (must
// match the launcher's), --optimizer=sgd|adam, --lr=X, --seed=N,
// --peer_timeout_ms=N (RpcOptions::peer_timeout), --progress_every=N (a line
// every N steps; default a twentieth of the steps), --loss_log=FILE (each
// trainer appends "<trainer> <step> <loss>" to FILE at every step, the loss
// to 17 digits), and checkpoints:
//
// --checkpoint_dir=DIR --checkpoint_every=N: the trainers save a checkpoint
// in DIR every N steps and after the last one (without --checkpoint_every,
// after the last one only) with tether::Checkpoint (tether/checkpoint.h):
// the parameter server writes its modules and its share of each trainer's
// optimizer, each trainer its LSTM, its optimizer's share, its data
// position, its generators and its losses so far. Started again with the
// same flags, the job resumes after the last complete checkpoint (a
// trainer killed while saving leaves an incomplete one, which is never
// loaded) and, with one trainer, every step's loss is the uninterrupted
// run's. The two newest complete checkpoints are kept.
#include <ATen/core/Generator.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "backends/builtin.h"
#include "core/rendezvous.h"
#include "core/rpc.h"
#include "examples/ps_model.h"
#include "rref/rref.h"
#include "tether/checkpoint.h"

namespace {

using tether::examples::ModelConfig;

struct Flags {
  int64_t steps = 200;
  std::string backend = "tensorpipe";
  int world_size = -1;
  int peer_timeout_ms = 0;  // 0: RpcOptions' default
  int64_t progress_every = 0;  // 0: a twentieth of the steps
  std::string loss_log;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // 0: after the last step
  bool elastic = false;
  ModelConfig model;
};

bool parse_flags(int argc, char** argv, Flags& flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = eq != std::string::npos;
    if (arg == "--elastic") {
      flags.elastic = true;
      ok = true;
    } else if (name == "--steps") {
      ok = ok && absl::SimpleAtoi(value, &flags.steps) && flags.steps > 0;
    } else if (name == "--backend") {
      flags.backend = value;
    } else if (name == "--peer_timeout_ms") {
      ok = ok && absl::SimpleAtoi(value, &flags.peer_timeout_ms) &&
           flags.peer_timeout_ms > 0;
    } else if (name == "--progress_every") {
      ok = ok && absl::SimpleAtoi(value, &flags.progress_every) &&
           flags.progress_every > 0;
    } else if (name == "--world_size") {
      ok = ok && absl::SimpleAtoi(value, &flags.world_size);
    } else if (name == "--optimizer") {
      if (value == "sgd") {
        flags.model.optimizer = tether::optim::Kind::kSGD;
      } else if (value == "adam") {
        flags.model.optimizer = tether::optim::Kind::kAdam;
        flags.model.lr = 0.01;
      } else {
        ok = false;
      }
    } else if (name == "--lr") {
      ok = ok && absl::SimpleAtod(value, &flags.model.lr) && flags.model.lr > 0;
    } else if (name == "--seed") {
      ok = ok && absl::SimpleAtoi(value, &flags.model.seed);
    } else if (name == "--loss_log") {
      flags.loss_log = value;
      ok = ok && !value.empty();
    } else if (name == "--checkpoint_dir") {
      flags.checkpoint_dir = value;
      ok = ok && !value.empty();
    } else if (name == "--checkpoint_every") {
      ok = ok && absl::SimpleAtoi(value, &flags.checkpoint_every) &&
           flags.checkpoint_every > 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "train: bad flag '%s' (see examples/train.cc)\n",
                   arg.c_str());
      return false;
    }
  }
  if (flags.checkpoint_every > 0 && flags.checkpoint_dir.empty()) {
    std::fprintf(stderr, "train: --checkpoint_every needs --checkpoint_dir\n");
    return false;
  }
  return true;
}

// One line of progress: a bar, the step, the loss and the rate.
void progress(const std::string& who, int64_t step, int64_t steps, double loss,
              double rate) {
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(kWidth * step / steps);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::printf("%s [%s] step %4lld/%lld  loss %.4f  %6.1f steps/s\n",
              who.c_str(), bar.c_str(), static_cast<long long>(step),
              static_cast<long long>(steps), loss, rate);
  std::fflush(stdout);
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += v[i];
  return sum / static_cast<double>(to - from);
}

// What a trainer saves in its checkpoints, and loads to resume: the
// parameter server's modules (`modules`: trainer 1 has them saved), and
// this trainer's own items (`own`): its share of the optimizer (saved on
// the parameter server), the LSTM, the data stream's position and
// generator, the default generator, and the losses so far. `members` save
// and load together, in `dir`.
absl::StatusOr<tether::Checkpoint> make_checkpoint(
    const std::string& dir, std::vector<std::string> members, bool modules,
    bool own, const tether::examples::Trainer& trainer,
    tether::examples::DataStream& data, std::vector<double>& losses) {
  tether::CheckpointOptions options;
  options.dir = dir;
  options.members = std::move(members);
  options.keep = 2;
  absl::StatusOr<tether::Checkpoint> checkpoint =
      tether::Checkpoint::create(options);
  if (!checkpoint.ok()) return checkpoint.status();
  std::vector<absl::Status> added;
  if (modules) {
    added.push_back(checkpoint->add_remote("embedding", trainer.embedding()));
    added.push_back(checkpoint->add_remote("decoder", trainer.decoder()));
  }
  if (own) {
    added.push_back(checkpoint->add_module("lstm", trainer.lstm().ptr()));
    added.push_back(
        checkpoint->add_optimizer("optimizer", trainer.optimizer()));
    added.push_back(checkpoint->add_generator("data", data.generator()));
    added.push_back(checkpoint->add_value(
        "data_position", [&data] { return c10::IValue(data.position()); },
        [&data](const c10::IValue& v) {
          data.set_position(v.toInt());
          return absl::OkStatus();
        }));
    added.push_back(checkpoint->add_generator(
        "rng", at::detail::getDefaultCPUGenerator()));
    added.push_back(checkpoint->add_value(
        "losses", [&losses] { return c10::IValue(c10::List<double>(losses)); },
        [&losses](const c10::IValue& v) {
          losses = v.toDoubleVector();
          return absl::OkStatus();
        }));
  }
  for (const absl::Status& s : added) {
    if (!s.ok()) return s;
  }
  return checkpoint;
}

// Where an elastic run's checkpoints go: each trainer's own in
// DIR/trainer<r> (it saves and loads them alone, so it can rejoin while
// the others run on), the parameter server's modules in DIR/ps (saved by
// trainer 1, loaded only when the whole job starts again).
std::string elastic_dir(const Flags& flags, const std::string& whose) {
  return absl::StrCat(flags.checkpoint_dir, "/", whose);
}

// This process replaces its own lost incarnation in a running group:
// tether_run --elastic says so (RpcOptions::rejoin).
bool rejoining() {
  const char* rejoin = std::getenv("TETHER_REJOIN");
  return rejoin != nullptr && std::string(rejoin) == "1";
}

// An elastic trainer may start before the parameter server has joined:
// waits until it is in the group, at most `bound`.
absl::Status wait_for_member(const std::string& name, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  for (;;) {
    absl::StatusOr<tether::WorkerInfo> info = tether::get_worker_info(name);
    if (info.ok()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "worker '", name, "' did not join the group within ",
          absl::FormatDuration(bound), ": ", info.status().message()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// Trains and reports; false if anything failed.
bool run_trainer(const Flags& flags, int rank, int world) {
  const std::string who = absl::StrCat("trainer", rank);
  auto fail = [&who](const absl::Status& status) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), status.ToString().c_str());
    return false;
  };
  if (flags.elastic) {
    if (absl::Status up = wait_for_member("ps", absl::Seconds(60)); !up.ok()) {
      return fail(up);
    }
  }
  absl::StatusOr<tether::examples::Trainer> trainer =
      tether::examples::Trainer::create(flags.model, "ps");
  if (!trainer.ok()) return fail(trainer.status());
  tether::examples::DataStream data(flags.model, rank);
  std::vector<double> losses;
  int64_t first = 1;
  // A static run's trainers save together; an elastic run's each alone,
  // and trainer 1 the parameter server's modules beside its own.
  std::optional<tether::Checkpoint> checkpoint;
  std::optional<tether::Checkpoint> modules;
  const bool rejoin = flags.elastic && rejoining();
  if (!flags.checkpoint_dir.empty()) {
    std::vector<std::string> trainers;
    for (int r = 1; r < world; ++r) trainers.push_back(absl::StrCat("trainer", r));
    absl::StatusOr<tether::Checkpoint> made =
        flags.elastic
            ? make_checkpoint(elastic_dir(flags, who), {who}, false, true,
                              *trainer, data, losses)
            : make_checkpoint(flags.checkpoint_dir, trainers, rank == 1, true,
                              *trainer, data, losses);
    if (!made.ok()) return fail(made.status());
    checkpoint = *std::move(made);
    if (flags.elastic && rank == 1) {
      made = make_checkpoint(elastic_dir(flags, "ps"), {who}, true, false,
                             *trainer, data, losses);
      if (!made.ok()) return fail(made.status());
      modules = *std::move(made);
      // Rejoining, it continues with the parameters the server holds now.
      if (!rejoin) {
        absl::StatusOr<std::optional<int64_t>> loaded = modules->load();
        if (!loaded.ok()) return fail(loaded.status());
      }
    }
    absl::StatusOr<std::optional<int64_t>> resumed = checkpoint->load();
    if (!resumed.ok()) return fail(resumed.status());
    if (resumed->has_value()) {
      first = **resumed + 1;
      std::printf("%s: %s from the checkpoint of step %lld in %s\n",
                  who.c_str(), rejoin ? "rejoined, resumed" : "resumed",
                  static_cast<long long>(**resumed),
                  flags.checkpoint_dir.c_str());
      std::fflush(stdout);
    }
  }
  FILE* loss_log = nullptr;
  if (!flags.loss_log.empty()) {
    loss_log = std::fopen(flags.loss_log.c_str(), "a");
    if (loss_log == nullptr) {
      std::fprintf(stderr, "%s: cannot open %s: %s\n", who.c_str(),
                   flags.loss_log.c_str(), std::strerror(errno));
      return false;
    }
  }
  const int64_t every = flags.progress_every > 0
                            ? flags.progress_every
                            : std::max<int64_t>(1, flags.steps / 20);
  const int64_t save_every =
      flags.checkpoint_every > 0 ? flags.checkpoint_every : flags.steps;
  const absl::Time start = absl::Now();
  for (int64_t step = first; step <= flags.steps; ++step) {
    absl::StatusOr<double> loss = trainer->step(data.next());
    if (!loss.ok()) {
      std::fprintf(stderr, "%s: step %lld: %s\n", who.c_str(),
                   static_cast<long long>(step),
                   loss.status().ToString().c_str());
      return false;
    }
    losses.push_back(*loss);
    if (loss_log != nullptr) {
      std::fprintf(loss_log, "%s %lld %.17g %.6f\n", who.c_str(),
                   static_cast<long long>(step), *loss,
                   absl::ToUnixMicros(absl::Now()) / 1e6);
      std::fflush(loss_log);
    }
    if (step % every == 0 || step == flags.steps) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      progress(who, step, flags.steps, *loss, (step - first + 1) / seconds);
    }
    if (checkpoint.has_value() &&
        (step % save_every == 0 || step == flags.steps)) {
      absl::StatusOr<tether::SavedCheckpoint> saved = checkpoint->save(step);
      if (!saved.ok()) return fail(saved.status());
      if (modules.has_value()) {
        absl::StatusOr<tether::SavedCheckpoint> shared = modules->save(step);
        if (!shared.ok()) return fail(shared.status());
      }
      if (rank == 1) {
        std::printf("%s checkpoint: step %lld, %lld files, %.1f KiB in "
                    "%.1f ms (%s)\n",
                    who.c_str(), static_cast<long long>(step),
                    static_cast<long long>(saved->files), saved->bytes / 1024.0,
                    absl::ToDoubleMilliseconds(saved->took),
                    saved->path.c_str());
        std::fflush(stdout);
      }
    }
  }
  if (loss_log != nullptr) std::fclose(loss_log);
  if (flags.elastic) {
    if (absl::Status done = tether::examples::report_done("ps", rank);
        !done.ok()) {
      return fail(done);
    }
  }
  const int64_t ran = flags.steps - first + 1;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (ran <= 0) {
    std::printf("%s summary: the checkpoint was of the last step, nothing "
                "to run\n",
                who.c_str());
    return true;
  }
  const size_t window = std::min<size_t>(10, losses.size());
  const double first_loss = mean(losses, 0, window);
  const double last_loss = mean(losses, losses.size() - window, losses.size());
  std::printf(
      "%s summary: %lld steps in %.2f s (%.1f steps/s), loss %.4f -> %.4f "
      "(mean of first and last %zu steps), %d trainer(s) on backend %s\n",
      who.c_str(), static_cast<long long>(ran), seconds, ran / seconds,
      first_loss, last_loss, window, world - 1, flags.backend.c_str());
  bool good = last_loss < first_loss;
  if (!good) std::fprintf(stderr, "%s: the loss did not go down\n", who.c_str());
  if (world == 2 && !flags.elastic &&
      losses.size() == static_cast<size_t>(flags.steps)) {
    // One trainer: the same training in this process with LibTorch alone
    // (a resumed run's earlier losses come from its checkpoint).
    const absl::Time local_start = absl::Now();
    std::vector<double> local =
        tether::examples::reference_losses(flags.model, flags.steps);
    const double local_seconds =
        absl::ToDoubleSeconds(absl::Now() - local_start);
    double worst = 0;
    for (size_t i = 0; i < losses.size(); ++i) {
      worst = std::max(worst,
                       std::abs(losses[i] - local[i]) / std::abs(local[i]));
    }
    const bool same = worst <= 1e-5;
    std::printf("%s check: every step's loss %s single-process LibTorch "
                "training (max relative difference %.2e; that training ran "
                "at %.1f steps/s)\n",
                who.c_str(), same ? "matches" : "DIFFERS FROM", worst,
                flags.steps / local_seconds);
    good = good && same;
  }
  return good;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!parse_flags(argc, argv, flags)) return 2;
  // Whichever launcher started us (tether_run, torchrun, mpirun, srun).
  absl::StatusOr<tether::LauncherEnv> launched = tether::launcher_env();
  const int rank = launched.ok() ? launched->rank : -1;
  const int world = launched.ok() ? launched->world_size : -1;
  if (rank < 0 || world < 2) {
    const std::string why = launched.ok()
                                ? absl::StrCat("world size ", world)
                                : std::string(launched.status().message());
    std::fprintf(stderr,
                 "train: %s; run me with a launcher and at least 2 processes, "
                 "e.g. bazel run //examples:run_training -- --nproc 3\n",
                 why.c_str());
    return 2;
  }
  if (flags.world_size > 0 && flags.world_size != world) {
    std::fprintf(stderr, "train: --world_size=%d but the launcher started %d\n",
                 flags.world_size, world);
    return 2;
  }
  tether::BackendRegistry registry;
  if (absl::Status s = tether::backends::register_builtin_backends(registry);
      !s.ok()) {
    std::fprintf(stderr, "train: %s\n", s.ToString().c_str());
    return 1;
  }
  if (rank == 0 && !flags.checkpoint_dir.empty()) {
    // The parameter server writes its modules and optimizers' parts there.
    std::vector<std::string> dirs = {flags.checkpoint_dir};
    if (flags.elastic) {
      dirs = {elastic_dir(flags, "ps")};
      for (int r = 1; r < world; ++r) {
        dirs.push_back(elastic_dir(flags, absl::StrCat("trainer", r)));
      }
    }
    for (const std::string& dir : dirs) {
      if (absl::Status s = tether::serve_checkpoints(dir); !s.ok()) {
        std::fprintf(stderr, "train: %s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  tether::RpcOptions options;
  options.backend = flags.backend;
  if (flags.peer_timeout_ms > 0) {
    options.peer_timeout = absl::Milliseconds(flags.peer_timeout_ms);
  }
  const std::string name = rank == 0 ? "ps" : absl::StrCat("trainer", rank);
  // Elastic: a dynamic group, which a restarted trainer rejoins while the
  // others run on.
  if (absl::Status up = tether::init_rpc(
          name, rank, flags.elastic ? tether::kDynamicGroup : world, options,
          registry,
          {tether::rref_extension(), tether::autograd::autograd_extension()});
      !up.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), up.ToString().c_str());
    return 1;
  }
  // What the launcher said, so that a run under mpirun, srun or torchrun
  // shows which process is which.
  std::printf("%s: rank %d of %d, local rank %d, pid %d\n", name.c_str(), rank,
              world, launched->local_rank, static_cast<int>(::getpid()));
  std::fflush(stdout);
  bool good = true;
  if (rank == 0) {
    std::printf("ps: serving the embedding table and decoder to %d trainer(s)\n",
                world - 1);
    std::fflush(stdout);
    // An elastic group's shutdown is a leave, not a barrier: the parameter
    // server waits for every trainer to say it is done.
    if (flags.elastic) tether::examples::wait_for_trainers(world - 1);
  } else {
    good = run_trainer(flags, rank, world);
  }
  // Graceful: the parameter server waits here until every trainer is done.
  if (absl::Status down = tether::shutdown(); !down.ok()) {
    std::fprintf(stderr, "%s: shutdown: %s\n", name.c_str(),
                 down.ToString().c_str());
    good = false;
  }
  if (rank == 0 && good) std::printf("ps: all trainers done\n");
  return good ? 0 : 1;
}

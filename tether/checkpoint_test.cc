// Checkpoints between workers of one process over loopback: a parameter
// server ("ps") owns a table that trainers reach by RRef; trainers save
// and load their own items and have the parameter server save theirs.
// Training resumed from a checkpoint takes the very steps the uninterrupted
// run took; a step without its marker is never loaded; errors name what is
// wrong.
#include "tether/checkpoint.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/nn/modules/linear.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "autograd/autograd.h"
#include "optim/optimizer.h"
#include "rref/rref.h"
#include "testing/loopback_group.h"
#include "testing/status_matchers.h"
#include "tether/internal/checkpoint_testing.h"

namespace tether {
namespace {

namespace fs = std::filesystem;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

// What the parameter server holds: a weight, trained by its users.
struct Table : torch::CustomClassHolder {
  explicit Table(int64_t seed)
      : weight(at::randn({3, 2}, at::detail::createCPUGenerator(seed))
                   .requires_grad_(true)) {}
  at::Tensor forward(const at::Tensor& x) { return at::matmul(x, weight); }
  c10::IValue parameters() {
    absl::StatusOr<RRef> r = RRef::local(weight);
    TORCH_CHECK(r.ok(), r.status().ToString());
    c10::impl::GenericList out(c10::AnyType::get());
    out.push_back(r->to_ivalue());
    return out;
  }
  c10::Dict<std::string, at::Tensor> state_dict() {
    c10::Dict<std::string, at::Tensor> out;
    out.insert("weight", weight.detach());
    return out;
  }
  void load_state_dict(const c10::Dict<std::string, at::Tensor>& state) {
    at::NoGradGuard no_grad;
    weight.copy_(state.at("weight"));
  }
  at::Tensor weight;
};

TORCH_LIBRARY(tether_checkpoint_test, m) {
  m.class_<Table>("Table")
      .def(torch::init<int64_t>())
      .def("forward", &Table::forward)
      .def("parameters", &Table::parameters)
      .def("state_dict", &Table::state_dict)
      .def("load_state_dict", &Table::load_state_dict);
}

constexpr char kTable[] =
    "__torch__.torch.classes.tether_checkpoint_test.Table";

std::string fresh_dir(const std::string& name) {
  static std::atomic<int> n{0};
  return internal::fresh_dir(absl::StrCat("checkpoint_test_", name, "_", n++));
}

using internal::files_of;

class Checkpoints : public testing::LoopbackGroup {
 protected:
  void SetUp() override {
    start(testing::group_options("checkpoint_test"),
          {"ps", "trainer1", "trainer2"},
          {rref_extension(), autograd::autograd_extension()});
  }
  Worker& ps() { return worker(0); }
  Worker& trainer(int i) { return worker(static_cast<size_t>(i)); }

  CheckpointOptions options(const std::string& dir,
                            std::vector<std::string> members = {}) {
    CheckpointOptions o;
    o.dir = dir;
    o.members = std::move(members);
    return o;
  }

  // Runs `fn(i)` for trainers 1 and 2 at once: save and load are
  // collective.
  template <typename T>
  std::vector<T> both(const std::function<T(int)>& fn) {
    std::vector<T> out(2);
    std::thread other([&] { out[1] = fn(2); });
    out[0] = fn(1);
    other.join();
    return out;
  }
};

// A small model trained by trainer 1: the parameter server's table (by
// RRef), a local Linear, a DistributedOptimizer over both owners, inputs
// drawn from a generator, and the count of steps taken.
struct Training {
  RRef table;
  torch::nn::Linear head{nullptr};
  std::optional<optim::DistributedOptimizer> optimizer;
  at::Generator data = at::detail::createCPUGenerator(5);
  int64_t position = 0;

  static Training make(Worker& trainer) {
    Training t;
    absl::StatusOr<RRef> table = remote(trainer, "ps", kTable, {int64_t{1}});
    EXPECT_THAT(table, IsOk());
    t.table = *table;
    t.head = torch::nn::Linear(2, 1);
    {
      at::NoGradGuard no_grad;
      t.head->weight.fill_(0.5);
      t.head->bias.fill_(0.1);
    }
    std::vector<RRef> params;
    absl::StatusOr<c10::IValue> remote_params =
        t.table.rpc_sync().call("parameters", {});
    EXPECT_THAT(remote_params, IsOk());
    for (const c10::IValue& p : remote_params->toListRef()) {
      params.push_back(*RRef::from_ivalue(p));
    }
    for (const at::Tensor& p : t.head->parameters()) {
      params.push_back(*RRef::local(trainer, p));
    }
    optim::Options sgd;
    sgd.lr = 0.05;
    sgd.momentum = 0.9;
    absl::StatusOr<optim::DistributedOptimizer> optimizer =
        optim::DistributedOptimizer::create(trainer, optim::Kind::kSGD, params,
                                            sgd);
    EXPECT_THAT(optimizer, IsOk());
    t.optimizer = *std::move(optimizer);
    return t;
  }

  absl::Status add_to(Checkpoint& checkpoint) {
    for (absl::Status s :
         {checkpoint.add_remote("table", table),
          checkpoint.add_module("head", head.ptr()),
          checkpoint.add_optimizer("optimizer", *optimizer),
          checkpoint.add_generator("data", data),
          checkpoint.add_value(
              "position", [this] { return c10::IValue(position); },
              [this](const c10::IValue& v) {
                position = v.toInt();
                return absl::OkStatus();
              })}) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  double step(Worker& trainer) {
    ++position;
    at::Tensor x = at::randn({4, 3}, data);
    absl::StatusOr<autograd::Context> context =
        autograd::Context::enter(trainer);
    EXPECT_THAT(context, IsOk());
    absl::StatusOr<c10::IValue> hidden = table.rpc_sync().call("forward", {x});
    EXPECT_THAT(hidden, IsOk());
    at::Tensor loss = (head(hidden->toTensor()) - 1.0).pow(2).mean();
    EXPECT_THAT(autograd::backward(trainer, context->id(), {loss}), IsOk());
    EXPECT_THAT(optimizer->step(context->id()), IsOk());
    return loss.item<double>();
  }
};

TEST_F(Checkpoints, ResumedTrainingTakesTheUninterruptedSteps) {
  const std::string dir = fresh_dir("resume");
  std::vector<double> uninterrupted;
  {
    Training run = Training::make(trainer(1));
    absl::StatusOr<Checkpoint> checkpoint =
        Checkpoint::create(trainer(1), options(dir));
    ASSERT_THAT(checkpoint, IsOk());
    ASSERT_THAT(run.add_to(*checkpoint), IsOk());
    absl::StatusOr<std::optional<int64_t>> none = checkpoint->load();
    ASSERT_THAT(none, IsOk());
    EXPECT_EQ(*none, std::nullopt);
    for (int i = 1; i <= 6; ++i) {
      uninterrupted.push_back(run.step(trainer(1)));
      if (i == 3) {
        absl::StatusOr<SavedCheckpoint> saved = checkpoint->save(3);
        ASSERT_THAT(saved, IsOk());
        EXPECT_EQ(saved->files, 2);  // trainer1.pt, ps.for-trainer1.pt
        EXPECT_EQ(saved->path, dir + "/step-00000003");
      }
    }
  }
  EXPECT_THAT(files_of(dir + "/step-00000003"),
              ElementsAre("COMPLETE", "ps.for-trainer1.pt", "trainer1.pt"));
  // A new table on the parameter server and a new optimizer, as after a
  // restart: the checkpoint puts back all that the steps depend on.
  Training again = Training::make(trainer(1));
  absl::StatusOr<Checkpoint> checkpoint =
      Checkpoint::create(trainer(1), options(dir));
  ASSERT_THAT(checkpoint, IsOk());
  ASSERT_THAT(again.add_to(*checkpoint), IsOk());
  absl::StatusOr<std::optional<int64_t>> resumed = checkpoint->load();
  ASSERT_THAT(resumed, IsOk());
  ASSERT_EQ(*resumed, std::optional<int64_t>(3));
  EXPECT_EQ(again.position, 3);
  for (int i = 4; i <= 6; ++i) {
    EXPECT_EQ(again.step(trainer(1)), uninterrupted[i - 1]) << "step " << i;
  }
}

TEST_F(Checkpoints, WithoutTheOptimizerStateTheStepsDiffer) {
  const std::string dir = fresh_dir("no_optimizer");
  Training run = Training::make(trainer(1));
  CheckpointOptions o = options(dir);
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::create(trainer(1), o);
  ASSERT_THAT(checkpoint, IsOk());
  ASSERT_THAT(checkpoint->add_remote("table", run.table), IsOk());
  ASSERT_THAT(checkpoint->add_module("head", run.head.ptr()), IsOk());
  ASSERT_THAT(checkpoint->add_generator("data", run.data), IsOk());
  run.step(trainer(1));
  ASSERT_THAT(checkpoint->save(1), IsOk());
  const double next = run.step(trainer(1));
  Training again = Training::make(trainer(1));
  absl::StatusOr<Checkpoint> loader = Checkpoint::create(trainer(1), o);
  ASSERT_THAT(loader, IsOk());
  ASSERT_THAT(loader->add_remote("table", again.table), IsOk());
  ASSERT_THAT(loader->add_module("head", again.head.ptr()), IsOk());
  ASSERT_THAT(loader->add_generator("data", again.data), IsOk());
  ASSERT_THAT(loader->load(), IsOk());
  // The same weights and input, but momentum starts over.
  const double fresh = again.step(trainer(1));
  EXPECT_EQ(fresh, next);  // the loss is computed before the update
  EXPECT_NE(again.step(trainer(1)), run.step(trainer(1)));
}

TEST_F(Checkpoints, MembersSaveAndLoadTogether) {
  const std::string dir = fresh_dir("members");
  std::vector<at::Tensor> weights = {at::full({2}, 1.0), at::full({2}, 2.0)};
  std::vector<RRef> tables(2);
  for (int i = 1; i <= 2; ++i) {
    absl::StatusOr<RRef> table =
        remote(trainer(i), "ps", kTable, {int64_t{10 + i}});
    ASSERT_THAT(table, IsOk());
    tables[i - 1] = *table;
  }
  auto checkpoint_of = [&](int i) {
    absl::StatusOr<Checkpoint> c =
        Checkpoint::create(trainer(i), options(dir, {"trainer2", "trainer1"}));
    EXPECT_THAT(c, IsOk());
    EXPECT_THAT(c->add_tensor("w", weights[i - 1]), IsOk());
    EXPECT_THAT(c->add_remote("table", tables[i - 1]), IsOk());
    return *std::move(c);
  };
  std::vector<Checkpoint> checkpoints = {checkpoint_of(1), checkpoint_of(2)};
  std::vector<absl::StatusOr<SavedCheckpoint>> saved =
      both<absl::StatusOr<SavedCheckpoint>>(
          [&](int i) { return checkpoints[i - 1].save(7); });
  ASSERT_THAT(saved[0], IsOk());
  ASSERT_THAT(saved[1], IsOk());
  EXPECT_EQ(saved[0]->files, 4);
  EXPECT_EQ(saved[0]->bytes, saved[1]->bytes);
  const std::string step_dir = dir + "/step-00000007";
  EXPECT_THAT(files_of(step_dir),
              ElementsAre("COMPLETE", "ps.for-trainer1.pt",
                          "ps.for-trainer2.pt", "trainer1.pt", "trainer2.pt"));
  int64_t on_disk = 0;
  for (const std::string& f : files_of(step_dir)) {
    if (f != "COMPLETE") on_disk += fs::file_size(step_dir + "/" + f);
  }
  EXPECT_EQ(saved[0]->bytes, on_disk);
  std::ifstream marker(step_dir + "/COMPLETE");
  const std::string text((std::istreambuf_iterator<char>(marker)),
                         std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("step 7\nmember trainer1\nmember trainer2\n"));

  weights[0].fill_(-1);
  weights[1].fill_(-2);
  for (const RRef& table : tables) {
    c10::Dict<std::string, at::Tensor> zero;
    zero.insert("weight", at::zeros({3, 2}));
    ASSERT_THAT(table.rpc_sync().call("load_state_dict", {zero}), IsOk());
  }
  std::vector<absl::StatusOr<std::optional<int64_t>>> loaded =
      both<absl::StatusOr<std::optional<int64_t>>>(
          [&](int i) { return checkpoints[i - 1].load(); });
  for (const auto& step : loaded) {
    ASSERT_THAT(step, IsOk());
    EXPECT_EQ(*step, std::optional<int64_t>(7));
  }
  EXPECT_TRUE(at::equal(weights[0], at::full({2}, 1.0)));
  EXPECT_TRUE(at::equal(weights[1], at::full({2}, 2.0)));
  for (int i = 1; i <= 2; ++i) {
    absl::StatusOr<c10::IValue> state =
        tables[i - 1].rpc_sync().call("state_dict", {});
    ASSERT_THAT(state, IsOk());
    const at::Tensor expected =
        at::randn({3, 2}, at::detail::createCPUGenerator(10 + i));
    EXPECT_TRUE(
        at::equal(state->toGenericDict().at("weight").toTensor(), expected));
  }

  // Loaded by other members: refused by every member.
  absl::StatusOr<Checkpoint> alone =
      Checkpoint::create(trainer(1), options(dir));
  ASSERT_THAT(alone, IsOk());
  ASSERT_THAT(alone->add_tensor("w", weights[0]), IsOk());
  EXPECT_THAT(alone->load(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("was saved by trainer1, trainer2; this "
                                 "job's members are trainer1")));
}

TEST_F(Checkpoints, AStepWithoutItsMarkerIsNeverLoaded) {
  const std::string dir = fresh_dir("incomplete");
  at::Tensor w = at::zeros({2});
  absl::StatusOr<Checkpoint> checkpoint =
      Checkpoint::create(trainer(1), options(dir));
  ASSERT_THAT(checkpoint, IsOk());
  ASSERT_THAT(checkpoint->add_tensor("w", w), IsOk());
  for (int step = 1; step <= 3; ++step) {
    w.fill_(step);
    ASSERT_THAT(checkpoint->save(step), IsOk());
  }
  // Step 3 as a job killed while saving it leaves it: no marker, a
  // temporary file. Step 4 only begun.
  fs::remove(dir + "/step-00000003/COMPLETE");
  std::ofstream(dir + "/step-00000003/.trainer1.pt.tmp-1-0") << "partial";
  fs::create_directory(dir + "/step-00000004");
  absl::StatusOr<std::optional<int64_t>> latest = Checkpoint::latest(dir);
  ASSERT_THAT(latest, IsOk());
  EXPECT_EQ(*latest, std::optional<int64_t>(2));
  absl::StatusOr<std::optional<int64_t>> loaded = checkpoint->load();
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(*loaded, std::optional<int64_t>(2));
  EXPECT_TRUE(at::equal(w, at::full({2}, 2.0)));
  // The incomplete steps after it are gone: the run saves them again.
  EXPECT_THAT(files_of(dir), ElementsAre("step-00000001", "step-00000002"));
}

TEST_F(Checkpoints, KeepRemovesTheOldest) {
  const std::string dir = fresh_dir("keep");
  CheckpointOptions o = options(dir);
  o.keep = 2;
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::create(trainer(1), o);
  ASSERT_THAT(checkpoint, IsOk());
  ASSERT_THAT(checkpoint->add_tensor("w", at::zeros({2})), IsOk());
  for (int step : {10, 20, 30}) ASSERT_THAT(checkpoint->save(step), IsOk());
  EXPECT_THAT(files_of(dir), ElementsAre("step-00000020", "step-00000030"));
}

TEST_F(Checkpoints, ErrorsNameWhatIsWrong) {
  const std::string dir = fresh_dir("errors");
  EXPECT_THAT(Checkpoint::create(trainer(1), options("")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Checkpoint::create(trainer(1), options(dir, {"trainer2"})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("leave out trainer1")));
  EXPECT_THAT(
      Checkpoint::create(trainer(1), options(dir, {"trainer1", "nobody"})),
      StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(
      Checkpoint::create(trainer(1), options(dir, {"trainer1", "trainer1"})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));

  absl::StatusOr<Checkpoint> checkpoint =
      Checkpoint::create(trainer(1), options(dir));
  ASSERT_THAT(checkpoint, IsOk());
  ASSERT_THAT(checkpoint->add_tensor("w", at::zeros({2})), IsOk());
  EXPECT_THAT(checkpoint->add_tensor("w", at::zeros({2})),
              StatusIs(absl::StatusCode::kAlreadyExists));
  ASSERT_THAT(checkpoint->save(1), IsOk());

  // An item the checkpoint lacks.
  absl::StatusOr<Checkpoint> more =
      Checkpoint::create(trainer(1), options(dir));
  ASSERT_THAT(more, IsOk());
  ASSERT_THAT(more->add_tensor("w", at::zeros({2})), IsOk());
  ASSERT_THAT(more->add_tensor("v", at::zeros({2})), IsOk());
  EXPECT_THAT(more->load(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("has no item 'v'")));
  // A tensor of another shape.
  absl::StatusOr<Checkpoint> other =
      Checkpoint::create(trainer(1), options(dir));
  ASSERT_THAT(other, IsOk());
  ASSERT_THAT(other->add_tensor("w", at::zeros({3})), IsOk());
  EXPECT_THAT(other->load(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("item 'w': the checkpoint's tensor is [2]")));
  // A value whose load throws: its error, not a crash.
  absl::StatusOr<Checkpoint> throwing =
      Checkpoint::create(trainer(1), options(dir));
  ASSERT_THAT(throwing, IsOk());
  ASSERT_THAT(throwing->add_value(
                  "w", [] { return c10::IValue(); },
                  [](const c10::IValue& v) {
                    v.toInt();  // a tensor: throws
                    return absl::OkStatus();
                  }),
              IsOk());
  EXPECT_THAT(throwing->load(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("item 'w': isInt() INTERNAL ASSERT FAILED")));
  // A part cut short after it was written.
  fs::resize_file(dir + "/step-00000001/trainer1.pt", 10);
  EXPECT_THAT(checkpoint->load(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is 10 bytes, the checkpoint's marker "
                                 "lists")));
  // An object without state_dict() (a list) on its owner.
  absl::StatusOr<RRef> list =
      remote(trainer(1), "ps", "aten::split", {at::ones({4}), int64_t{2}});
  ASSERT_THAT(list, IsOk());
  ASSERT_THAT(checkpoint->add_remote("list", *list), IsOk());
  EXPECT_THAT(checkpoint->save(2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("item 'list': it holds a Tensor[]")));
  EXPECT_THAT(Checkpoint::latest(dir), IsOk());
  EXPECT_EQ(*Checkpoint::latest(dir), std::optional<int64_t>(1));
  // An owner writes only where it serves checkpoints.
  c10::impl::GenericDict items(c10::StringType::get(), c10::AnyType::get());
  items.insert("list", list->to_ivalue());
  EXPECT_THAT(trainer(1).rpc_sync("ps", "tether::checkpoint_write_part",
                                  {fresh_dir("unserved"), int64_t{1},
                                   std::string("trainer1"), items}),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("tether::serve_checkpoints")));
  // A peer's bad call, in a directory served: refused, naming why.
  EXPECT_THAT(
      trainer(1).rpc_sync("ps", "tether::checkpoint_write_part",
                          {dir, int64_t{-1}, std::string("trainer1"), items}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("0 or more, not -1")));
  c10::impl::GenericDict unnamed(c10::IntType::get(), c10::AnyType::get());
  unnamed.insert(int64_t{1}, list->to_ivalue());
  EXPECT_THAT(
      trainer(1).rpc_sync("ps", "tether::checkpoint_write_part",
                          {dir, int64_t{1}, std::string("trainer1"), unnamed}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("named by strings")));
}

}  // namespace
}  // namespace tether

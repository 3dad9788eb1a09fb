#include "examples/ps_model.h"

#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/optim.h>

#include <cmath>
#include <condition_variable>
#include <mutex>
#include <set>

#include "autograd/autograd.h"
#include "core/rpc.h"

namespace tether::examples {
namespace {

at::Generator generator(int64_t seed) {
  return at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
}

// RRefs, owned by the serving worker, to `params`.
c10::IValue parameter_rrefs(const std::vector<at::Tensor>& params) {
  c10::impl::GenericList out(c10::AnyType::get());
  for (const at::Tensor& p : params) {
    absl::StatusOr<RRef> r = RRef::local(p);
    TORCH_CHECK(r.ok(), r.status().ToString());
    out.push_back(r->to_ivalue());
  }
  return out;
}

at::Tensor embedding_weight(const ModelConfig& c) {
  at::Generator gen = generator(c.seed * 10 + 1);
  return (at::randn({c.vocab, c.embed}, gen) * 0.3).requires_grad_(true);
}

std::pair<at::Tensor, at::Tensor> decoder_weights(const ModelConfig& c) {
  at::Generator gen = generator(c.seed * 10 + 2);
  return {(at::randn({c.vocab, c.hidden}, gen) / std::sqrt(c.hidden))
              .requires_grad_(true),
          at::zeros({c.vocab}).requires_grad_(true)};
}

torch::nn::LSTM make_lstm(const ModelConfig& c) {
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(c.embed, c.hidden));
  at::Generator gen = generator(c.seed * 10 + 3);
  const double k = 1.0 / std::sqrt(static_cast<double>(c.hidden));
  at::NoGradGuard no_grad;
  for (at::Tensor& p : lstm->parameters()) {
    p.copy_(at::rand(p.sizes(), gen) * (2 * k) - k);
  }
  return lstm;
}

// Named tensors as a state_dict, and loading one back into them.
using Named = std::vector<std::pair<std::string, at::Tensor>>;

c10::Dict<std::string, at::Tensor> state_of(const Named& tensors) {
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& [name, tensor] : tensors) out.insert(name, tensor.detach());
  return out;
}

void load_state(const Named& tensors,
                const c10::Dict<std::string, at::Tensor>& state) {
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(state.contains(name), "the state has no '", name, "'");
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : tensors) tensor.copy_(state.at(name));
}

// The embedding on the parameter server.
struct EmbeddingTable : torch::CustomClassHolder {
  explicit EmbeddingTable(const ModelConfig& c) : weight(embedding_weight(c)) {}
  at::Tensor forward(const at::Tensor& tokens) {
    return at::embedding(weight, tokens);
  }
  c10::IValue parameters() { return parameter_rrefs({weight}); }
  Named named() { return {{"weight", weight}}; }
  c10::Dict<std::string, at::Tensor> state_dict() { return state_of(named()); }
  void load_state_dict(const c10::Dict<std::string, at::Tensor>& state) {
    load_state(named(), state);
  }
  at::Tensor weight;
};

// The decoder on the parameter server. Its forward uses a copy of the
// weight: another trainer's optimizer step may change the weight in place
// before this trainer's backward needs it.
struct Decoder : torch::CustomClassHolder {
  explicit Decoder(const ModelConfig& c) {
    std::tie(weight, bias) = decoder_weights(c);
  }
  at::Tensor forward(const at::Tensor& hidden) {
    return at::linear(hidden, weight.clone(), bias);
  }
  c10::IValue parameters() { return parameter_rrefs({weight, bias}); }
  Named named() { return {{"weight", weight}, {"bias", bias}}; }
  c10::Dict<std::string, at::Tensor> state_dict() { return state_of(named()); }
  void load_state_dict(const c10::Dict<std::string, at::Tensor>& state) {
    load_state(named(), state);
  }
  at::Tensor weight;
  at::Tensor bias;
};

// get_model(int vocab, int embed, int hidden, int seed) -> Any: the
// parameter server's (EmbeddingTable, Decoder) RRefs, made by the first call.
c10::IValue get_model(int64_t vocab, int64_t embed, int64_t hidden,
                      int64_t seed) {
  static std::mutex mu;
  static c10::IValue* model = nullptr;
  static ModelConfig made;
  std::lock_guard<std::mutex> lock(mu);
  if (model == nullptr) {
    made.vocab = vocab;
    made.embed = embed;
    made.hidden = hidden;
    made.seed = seed;
    absl::StatusOr<RRef> e =
        RRef::local(c10::make_intrusive<EmbeddingTable>(made));
    TORCH_CHECK(e.ok(), e.status().ToString());
    absl::StatusOr<RRef> d = RRef::local(c10::make_intrusive<Decoder>(made));
    TORCH_CHECK(d.ok(), d.status().ToString());
    model = new c10::IValue(
        c10::ivalue::Tuple::create({e->to_ivalue(), d->to_ivalue()}));
  }
  TORCH_CHECK(made.vocab == vocab && made.embed == embed &&
                  made.hidden == hidden && made.seed == seed,
              "the parameter server's model was made with other sizes");
  return *model;
}

// The trainers that said they are done (trainer_done), for
// wait_for_trainers.
struct Finished {
  std::mutex mu;
  std::condition_variable changed;
  std::set<int64_t> ranks;
};

Finished& finished() {
  static auto* f = new Finished();  // never destroyed: handlers may run late
  return *f;
}

// trainer_done(int rank) -> int: trainer `rank` has trained its last step;
// returns how many have.
int64_t trainer_done(int64_t rank) {
  Finished& f = finished();
  std::lock_guard<std::mutex> lock(f.mu);
  f.ranks.insert(rank);
  f.changed.notify_all();
  return static_cast<int64_t>(f.ranks.size());
}

TORCH_LIBRARY(tether_examples, m) {
  m.class_<EmbeddingTable>("EmbeddingTable")
      .def("forward", &EmbeddingTable::forward)
      .def("parameters", &EmbeddingTable::parameters)
      .def("state_dict", &EmbeddingTable::state_dict)
      .def("load_state_dict", &EmbeddingTable::load_state_dict);
  m.class_<Decoder>("Decoder")
      .def("forward", &Decoder::forward)
      .def("parameters", &Decoder::parameters)
      .def("state_dict", &Decoder::state_dict)
      .def("load_state_dict", &Decoder::load_state_dict);
  m.def("get_model(int vocab, int embed, int hidden, int seed) -> Any",
        &get_model);
  m.def("trainer_done(int rank) -> int", &trainer_done);
}

optim::Options optimizer_options(const ModelConfig& c) {
  optim::Options options;
  options.lr = c.lr;
  if (c.optimizer == optim::Kind::kSGD) options.momentum = 0.9;
  return options;
}

at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& tokens,
                   int64_t sequence) {
  at::Tensor targets = tokens.slice(1, 1, sequence + 1).transpose(0, 1);
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                targets.reshape({-1}));
}

}  // namespace

void wait_for_trainers(int64_t trainers) {
  Finished& f = finished();
  std::unique_lock<std::mutex> lock(f.mu);
  f.changed.wait(lock, [&] {
    return static_cast<int64_t>(f.ranks.size()) >= trainers;
  });
}

absl::Status report_done(const std::string& ps, int64_t rank) {
  return rpc_sync(ps, kTrainerDone, {rank}).status();
}

DataStream::DataStream(const ModelConfig& config, int trainer)
    : config_(config),
      generator_(examples::generator(config.seed * 1000003 + trainer * 100003)) {
  // A fixed random Markov chain: from each token, 4 likely successors.
  at::Generator chain = examples::generator(config.seed * 10 + 4);
  transitions_ = at::softmax(
      at::randn({config.vocab, config.vocab}, chain) * 3, 1);
}

at::Tensor DataStream::next() {
  const ModelConfig& c = config_;
  at::Tensor tokens = at::empty({c.batch, c.sequence + 1}, at::kLong);
  at::Tensor current = at::randint(c.vocab, {c.batch}, generator_);
  tokens.select(1, 0).copy_(current);
  for (int64_t t = 1; t <= c.sequence; ++t) {
    current = at::multinomial(transitions_.index_select(0, current), 1,
                              /*replacement=*/true, generator_)
                  .squeeze(1);
    tokens.select(1, t).copy_(current);
  }
  ++position_;
  return tokens;
}

absl::StatusOr<Trainer> Trainer::create(const ModelConfig& config,
                                        const std::string& ps) {
  absl::StatusOr<c10::IValue> model =
      rpc_sync(ps, kGetModel,
               {config.vocab, config.embed, config.hidden, config.seed});
  if (!model.ok()) return model.status();
  absl::StatusOr<RRef> embedding =
      RRef::from_ivalue(model->toTupleRef().elements()[0]);
  if (!embedding.ok()) return embedding.status();
  absl::StatusOr<RRef> decoder =
      RRef::from_ivalue(model->toTupleRef().elements()[1]);
  if (!decoder.ok()) return decoder.status();

  std::vector<RRef> params;
  for (const RRef& module : {*embedding, *decoder}) {
    absl::StatusOr<c10::IValue> remote_params =
        module.rpc_sync().call("parameters", {});
    if (!remote_params.ok()) return remote_params.status();
    for (const c10::IValue& p : remote_params->toListRef()) {
      absl::StatusOr<RRef> r = RRef::from_ivalue(p);
      if (!r.ok()) return r.status();
      params.push_back(*r);
    }
  }
  torch::nn::LSTM lstm = make_lstm(config);
  for (const at::Tensor& p : lstm->parameters()) {
    absl::StatusOr<RRef> r = RRef::local(p);
    if (!r.ok()) return r.status();
    params.push_back(*r);
  }
  absl::StatusOr<optim::DistributedOptimizer> optimizer =
      optim::DistributedOptimizer::create(config.optimizer, params,
                                          optimizer_options(config));
  if (!optimizer.ok()) return optimizer.status();
  return Trainer(config, *std::move(embedding), *std::move(decoder),
                 std::move(lstm), *std::move(optimizer));
}

absl::StatusOr<double> Trainer::step(const at::Tensor& tokens) {
  absl::StatusOr<autograd::Context> context = autograd::Context::enter();
  if (!context.ok()) return context.status();
  at::Tensor inputs = tokens.slice(1, 0, config_.sequence);
  absl::StatusOr<c10::IValue> embedded =
      embedding_.rpc_sync().call("forward", {inputs});
  if (!embedded.ok()) return embedded.status();
  at::Tensor hidden =
      std::get<0>(lstm_->forward(embedded->toTensor().transpose(0, 1)));
  absl::StatusOr<c10::IValue> logits =
      decoder_.rpc_sync().call("forward", {hidden});
  if (!logits.ok()) return logits.status();
  at::Tensor loss = loss_of(logits->toTensor(), tokens, config_.sequence);
  if (absl::Status back = autograd::backward(context->id(), {loss});
      !back.ok()) {
    return back;
  }
  if (absl::Status stepped = optimizer_.step(context->id()); !stepped.ok()) {
    return stepped;
  }
  return loss.item<double>();
}

std::vector<double> reference_losses(const ModelConfig& config,
                                     int64_t steps) {
  at::Tensor embedding = embedding_weight(config);
  auto [weight, bias] = decoder_weights(config);
  torch::nn::LSTM lstm = make_lstm(config);
  std::vector<at::Tensor> params = {embedding, weight, bias};
  for (const at::Tensor& p : lstm->parameters()) params.push_back(p);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (config.optimizer == optim::Kind::kSGD) {
    optimizer = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(config.lr).momentum(0.9));
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(config.lr));
  }
  std::vector<double> losses;
  DataStream data(config, /*trainer=*/1);
  for (int64_t step = 1; step <= steps; ++step) {
    at::Tensor tokens = data.next();
    optimizer->zero_grad();
    at::Tensor embedded =
        at::embedding(embedding, tokens.slice(1, 0, config.sequence));
    at::Tensor hidden = std::get<0>(lstm->forward(embedded.transpose(0, 1)));
    at::Tensor logits = at::linear(hidden, weight.clone(), bias);
    at::Tensor loss = loss_of(logits, tokens, config.sequence);
    loss.backward();
    optimizer->step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace tether::examples

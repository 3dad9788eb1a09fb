// The model of the main job (examples/train.cc): a next-token language model
// split the way PyTorch's RPC tutorials split it.
//
//   tokens -> EmbeddingTable (parameter server) -> LSTM (trainer, local)
//          -> Decoder (parameter server) -> cross-entropy with next tokens
//
// The parameter server keeps one EmbeddingTable and one Decoder (TorchScript
// custom classes, __torch__.torch.classes.tether_examples.*, with
// state_dict() and load_state_dict(state) for checkpoints) shared by every
// trainer; trainers reach them through RRef proxies, run backward with
// distributed autograd and update every parameter with a
// DistributedOptimizer. The data is generated: token sequences of a fixed
// random Markov chain, so the loss has a floor the model can learn toward.
//
// reference_losses() trains the same model, with the same initial weights
// and batches, in one process with plain LibTorch: with one trainer the
// distributed run must produce the same loss at every step.
//
// Thread safety: Trainer is used by one thread; the classes on the parameter
// server serve concurrent trainers (their forward snapshots the weights, so
// a concurrent optimizer step does not invalidate a saved graph).
#ifndef TETHER_EXAMPLES_PS_MODEL_H_
#define TETHER_EXAMPLES_PS_MODEL_H_

#include <ATen/ATen.h>
#include <absl/status/statusor.h>
#include <torch/nn/modules/rnn.h>

#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "rref/rref.h"

namespace tether::examples {

struct ModelConfig {
  int64_t vocab = 48;
  int64_t embed = 32;
  int64_t hidden = 64;
  int64_t batch = 16;
  int64_t sequence = 16;
  int64_t seed = 1;
  optim::Kind optimizer = optim::Kind::kSGD;
  double lr = 0.5;
};

// The parameter server's model, as the trainers see it.
inline constexpr char kGetModel[] = "tether_examples::get_model";
inline constexpr char kTrainerDone[] = "tether_examples::trainer_done";

// The batches one trainer trains on, in order: token sequences of a fixed
// random Markov chain, drawn with the trainer's own generator (seeded by
// the config's seed and the trainer). What comes next depends on the
// generator's state and on how many batches were drawn: a checkpoint saves
// both (examples/train.cc).
class DataStream {
 public:
  DataStream(const ModelConfig& config, int trainer);

  // The next batch: tokens of shape [batch, sequence + 1] (inputs are
  // [:, :-1], targets [:, 1:]).
  at::Tensor next();

  // How many batches were drawn.
  int64_t position() const { return position_; }
  void set_position(int64_t position) { position_ = position; }
  // The generator the batches are drawn with (a handle: it shares the
  // state).
  at::Generator generator() const { return generator_; }

 private:
  ModelConfig config_;
  at::Tensor transitions_;  // [vocab, vocab], each row a distribution
  at::Generator generator_;
  int64_t position_ = 0;
};

// One trainer of the distributed model; `ps` names the parameter server.
class Trainer {
 public:
  [[nodiscard]] static absl::StatusOr<Trainer> create(
      const ModelConfig& config, const std::string& ps);

  // One step in its own distributed autograd context: forward through the
  // parameter server, backward, optimizer step. Returns the loss.
  [[nodiscard]] absl::StatusOr<double> step(const at::Tensor& tokens);

  // What a checkpoint saves: the parameter server's modules (custom
  // classes with state_dict() and load_state_dict(state)), the local LSTM
  // and the optimizer of all of them.
  const RRef& embedding() const { return embedding_; }
  const RRef& decoder() const { return decoder_; }
  const torch::nn::LSTM& lstm() const { return lstm_; }
  const optim::DistributedOptimizer& optimizer() const { return optimizer_; }

 private:
  Trainer(ModelConfig config, RRef embedding, RRef decoder,
          torch::nn::LSTM lstm, optim::DistributedOptimizer optimizer)
      : config_(config),
        embedding_(std::move(embedding)),
        decoder_(std::move(decoder)),
        lstm_(std::move(lstm)),
        optimizer_(std::move(optimizer)) {}

  ModelConfig config_;
  RRef embedding_;
  RRef decoder_;
  torch::nn::LSTM lstm_;
  optim::DistributedOptimizer optimizer_;
};

// The losses of `steps` steps of trainer 1's batches, trained in this
// process with LibTorch alone (torch::optim, local autograd).
std::vector<double> reference_losses(const ModelConfig& config, int64_t steps);

// An elastic run's end (examples/train --elastic), whose group has no
// graceful barrier to wait in: each trainer reports it is done to the
// parameter server, which waits for `trainers` of them (each rank counted
// once, a rejoined trainer too).
absl::Status report_done(const std::string& ps, int64_t rank);
void wait_for_trainers(int64_t trainers);

}  // namespace tether::examples

#endif  // TETHER_EXAMPLES_PS_MODEL_H_

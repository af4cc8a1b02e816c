// A neural surrogate trained on a solver's own shards: on one 2x2 mesh, random
// coefficient fields k are drawn, -div(k grad u) = 1 (u = 0 on the boundary of the unit
// square) is solved for each with dtensor's multigrid on the sharded grid, and a
// Fourier neural operator learns u from k on the same shards. The data never leaves
// the ranks that own it: no file, no gather; each rank's block of a solution is its
// block of the training image.
//
//   data      31 x 31 interior nodes (h = 1/32); log k a random smooth field (15 cosine
//             modes, standard deviation about 0.6: k mostly in 0.3-3); 32 training and 4 held-out samples;
//             u from V-cycles of MgSolver to a relative residual of 1e-10
//   model     lift 1x1 (log k, x, y -> 12) - 3 FNO layers (nn::FnoBlock: spectral conv
//             keeping 8 x 8 frequencies at both ends of H and the low end of W, plus a 1x1
//             conv, GELU) - 1x1 (12 -> 32) - GELU - 1x1 (32 -> 1); float32; AdamW lr 3e-3,
//             batch 4, 25 epochs (200 steps)
//   meshes    2x2 over H and W (the solver's own decomposition), beside the same run on
//             one rank
//
// Usage:
//   build/examples/train_surrogate [-out DIR]          4 in-process ranks (threads)
//   mpirun -np 4 build/examples/train_surrogate_mpi    4 processes
// Prints the loss per step beside the single-rank run and the surrogate's relative L2
// error against the solver on the held-out samples, before and after training. Exits 1
// if any step's loss differs from one rank's by more than 1e-4 relative, or the
// held-out error is not below 0.1 after training (nor a third of the untrained one).
// With -out DIR (made where missing), rank 0 writes the first held-out sample as
// DIR/surrogate_{logk, u, pred, error}.npy (float64, [31, 31], row y, column x: a
// gather, for the plot only); examples/plot_surrogate.py
// draws them as DIR/surrogate.png. Where parallel HDF5 was found, every rank also
// writes its blocks of the same fields to DIR/surrogate.h5, described by
// DIR/surrogate.xmf (ParaView and VisIt open it).
#include <dtensor/cnn.hpp>
#include <dtensor/solvers.hpp>
#include <dtensor/spectral.hpp>
#ifdef DTENSOR_HAVE_HDF5
#include <dtensor/io/hdf5.hpp>
#include <dtensor/io/xdmf.hpp>
#endif

#include "common.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <string>
#include <vector>

using namespace dtensor;

namespace {

constexpr int64_t kN = 31;
constexpr double kH = 1.0 / (kN + 1);
constexpr int kTrain = 32, kTest = 4, kBatch = 4, kEpochs = 25;
constexpr int64_t kWidth = 12;
constexpr std::array<int64_t, 2> kModes{8, 8};
constexpr auto k1 = nn::ConvSpec<2>::square(1);

using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;  // H over mesh dim 0, W over 1
using Grid = DTensor<double, 2, Shard<0>, Shard<1>>;                          // the solver's: the same blocks
using Fno = nn::FnoBlock<Img, kWidth, kModes>;
using Model = nn::Sequential<nn::Conv<Img, 3, kWidth, k1>, Fno, Fno, Fno, nn::Conv<Img, kWidth, 32, k1>,
                             nn::GELU<Img>, nn::Conv<Img, 32, 1, k1>>;
using Image = Model::InputT;  // [N, C, H, W], H and W sharded as the grid's dims 0 and 1

// log k of sample s at (x, y): 15 cosine modes (the constant one left out) with random
// weights decaying as 1/(1 + p^2 + q^2): a standard deviation of about 0.6.
double log_k(int s, double x, double y) {
  double v = 0;
  for (int p = 0; p < 4; ++p)
    for (int q = 0; q < 4; ++q) {
      if (p + q == 0) continue;
      const double c = dtensor::detail::normal_value<double>(7000 + s, static_cast<uint64_t>(p * 4 + q));
      v += 0.8 * c * std::cos(std::numbers::pi * p * x) * std::cos(std::numbers::pi * q * y) / (1.0 + p * p + q * q);
    }
  return v;
}

struct Sample {
  Grid logk, u;
};

// The solver's u for sample s, and log k at the same nodes: each rank its own block.
Sample solve(const DeviceMesh<2>& mesh, int s) {
  auto node = [](int64_t g) { return static_cast<double>(g + 1) * kH; };
  const VarCoeffLaplacian5<double, Shard<0>, Shard<1>> A(
      sample_coefficient<double, Shard<0>, Shard<1>>(
          mesh, Shape<2>{kN, kN}, [&](std::array<int64_t, 2> g) { return std::exp(log_k(s, node(g[1]), node(g[0]))); }),
      kH);
  const Grid b = full<double, Shard<0>, Shard<1>>(Shape<2>{kN, kN}, mesh, 1.0);
  Grid u = zeros<double, Shard<0>, Shard<1>>(Shape<2>{kN, kN}, mesh);
  MgOptions mo;
  mo.stop = {.max_iters = 100, .rtol = 1e-10};
  MgSolver mg(A, b, mo);
  const SolveResult r = mg.solve(b, u);
  DTENSOR_CHECK(r.converged, InvalidArgument, "train_surrogate: multigrid did not converge on sample ", s);
  Grid lk = from_function<double, Shard<0>, Shard<1>>(Shape<2>{kN, kN}, mesh, [&](uint64_t i) {
    return log_k(s, node(static_cast<int64_t>(i) % kN), node(static_cast<int64_t>(i) / kN));
  });
  return {std::move(lk), std::move(u)};
}

// Samples [first, first + count) as one image batch, each rank copying its own blocks:
// the inputs (log k, x, y) or the targets (u * u_scale).
Image batch(const std::vector<Sample>& data, int first, int count, bool target, double u_scale,
            const DeviceMesh<2>& mesh) {
  const int64_t C = target ? 1 : 3;
  const Grid& g0 = data[first].u;
  // The grid's blocks of rows and columns, as the image's blocks of H and W.
  Splits<4> blocks{};
  blocks[2] = g0.layout().blocks[0];
  blocks[3] = g0.layout().blocks[1];
  const auto layout = ShardLayout<4>::make(Shape<4>{count, C, kN, kN}, Image::placement_state, mesh.shape(), blocks);
  const auto ls = g0.local_shape();
  const auto off = g0.local_offset();
  auto local = Tensor<float, 4>::uninitialized(Shape<4>{count, C, ls[0], ls[1]});
  float* p = local.data();
  for (int n = 0; n < count; ++n) {
    const Sample& s = data[first + n];
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < ls[0]; ++i)
        for (int64_t j = 0; j < ls[1]; ++j) {
          double v;
          if (target) v = s.u.local()(i, j) * u_scale;
          else if (c == 0) v = s.logk.local()(i, j);
          else if (c == 1) v = static_cast<double>(off[1] + j + 1) * kH;  // x
          else v = static_cast<double>(off[0] + i + 1) * kH;              // y
          *p++ = static_cast<float>(v);
        }
  }
  return Image(mesh, layout, std::move(local));
}

// The held-out samples' relative L2 error: sqrt(sum (pred - u)^2 / sum u^2), averaged.
double held_out_error(Model& model, const std::vector<Sample>& test, double u_scale, const DeviceMesh<2>& mesh,
                      Tensor<float, 4>* first_prediction, Tensor<float, 4>* first_block = nullptr) {
  double total = 0;
  for (int s = 0; s < kTest; ++s) {
    const auto y = model.forward(batch(test, s, 1, false, u_scale, mesh));
    model.release_saved();
    const auto want = batch(test, s, 1, true, u_scale, mesh);
    // Each rank's block (the prediction's blocks are the target's), its two sums added
    // over the mesh: no gather.
    double sums[2] = {0, 0};
    const auto& p = y.local();
    const auto& w = want.local();
    for (int64_t i = 0; i < p.numel(); ++i) {
      sums[0] += std::pow(double(p.data()[i]) - w.data()[i], 2);
      sums[1] += std::pow(double(w.data()[i]), 2);
    }
    all_reduce_values(mesh.comm(), sums, 2, ReduceOp::Sum);
    total += std::sqrt(sums[0] / sums[1]);
    if (s == 0 && first_prediction) *first_prediction = y.full_tensor();  // for rank 0's .npy files
    if (s == 0 && first_block) *first_block = y.local();
  }
  return total / kTest;
}

void write_npy(const std::string& path, const std::vector<double>& v) {
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (" + std::to_string(kN) + ", " +
                       std::to_string(kN) + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << header;
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(double)));
  DTENSOR_CHECK(f.good(), InvalidArgument, "train_surrogate: cannot write ", path);
}

struct Outcome {
  double before = 0, after = 0;
};

std::vector<float> train(const DeviceMesh<2>& mesh, Outcome* out, const std::string& out_dir, bool write) {
  std::vector<Sample> data, test;
  for (int s = 0; s < kTrain; ++s) data.push_back(solve(mesh, s));
  for (int s = 0; s < kTest; ++s) test.push_back(solve(mesh, 1000 + s));
  // u scaled to about 1: by the training set's largest value (one all-reduce).
  std::vector<double> umax{0.0};
  for (const auto& s : data)
    for (int64_t i = 0; i < s.u.local().numel(); ++i) umax[0] = std::max(umax[0], std::abs(s.u.local().data()[i]));
  all_reduce<double>(mesh.comm(), umax, ReduceOp::Max);
  const double u_scale = 1.0 / umax[0];

  Model model(nn::Conv<Img, 3, kWidth, k1>(mesh, {1}), nn::make_fno_block<Img, kWidth, kModes>(mesh, 10),
              nn::make_fno_block<Img, kWidth, kModes>(mesh, 20), nn::make_fno_block<Img, kWidth, kModes>(mesh, 30),
              nn::Conv<Img, kWidth, 32, k1>(mesh, {40}), nn::GELU<Img>(), nn::Conv<Img, 32, 1, k1>(mesh, {41}));
  nn::MSELoss<Img> loss;
  nn::AdamW opt({.lr = 3e-3, .weight_decay = 0});
  out->before = held_out_error(model, test, u_scale, mesh, nullptr);
  std::vector<float> losses;
  for (int epoch = 0; epoch < kEpochs; ++epoch)
    for (int b = 0; b < kTrain / kBatch; ++b) {
      const int first = ((b + epoch) % (kTrain / kBatch)) * kBatch;  // the batches in a rotating order
      const auto x = batch(data, first, kBatch, false, u_scale, mesh);
      const auto t = batch(data, first, kBatch, true, u_scale, mesh);
      model.zero_grad();
      const auto y = model.forward(x);
      losses.push_back(loss.forward(y, t));
      model.backward(loss.backward(y));
      opt.step(model);
    }
  Tensor<float, 4> pred, pred_block;
  out->after = held_out_error(model, test, u_scale, mesh, &pred, &pred_block);
#ifdef DTENSOR_HAVE_HDF5
  if (write) {
    // The same sample as fields ParaView opens: each rank writes its own blocks
    // (io/hdf5.hpp), the prediction's block being the grid's.
    const Grid& u = test[0].u;
    Grid p(mesh, u.layout(), Tensor<double, 2>::uninitialized(u.local_shape()));
    Grid e = p;
    for (int64_t i = 0; i < p.local().numel(); ++i) {
      p.local().data()[i] = pred_block.data()[i] / u_scale;
      e.local().data()[i] = p.local().data()[i] - u.local().data()[i];
    }
    const std::string h5 = out_dir + "/surrogate.h5";
    io::write_hdf5(h5, "logk", test[0].logk, {.mode = io::FileMode::Replace});
    io::write_hdf5(h5, "u", u, {.mode = io::FileMode::Update});
    io::write_hdf5(h5, "pred", p, {.mode = io::FileMode::Update});
    io::write_hdf5(h5, "error", e, {.mode = io::FileMode::Update});
    std::vector<io::XdmfField> fields;
    for (const char* f : {"logk", "u", "pred", "error"}) fields.push_back({f, f, io::Center::Node});
    io::write_xdmf(out_dir + "/surrogate.xmf", {.points = {kN, kN}, .origin = {kH, kH, 0}, .spacing = {kH, kH, 1}},
                   h5, fields, mesh.comm());
  }
#endif
  if (write) {
    const auto u = test[0].u.full_tensor(), lk = test[0].logk.full_tensor();  // collective: every rank
    if (mesh.comm().rank() != 0) return losses;
    std::vector<double> vu(u.data(), u.data() + u.numel()), vk(lk.data(), lk.data() + lk.numel()), vp, ve;
    for (int64_t i = 0; i < pred.numel(); ++i) {
      vp.push_back(pred.data()[i] / u_scale);
      ve.push_back(vp.back() - vu[i]);
    }
    write_npy(out_dir + "/surrogate_logk.npy", vk);
    write_npy(out_dir + "/surrogate_u.npy", vu);
    write_npy(out_dir + "/surrogate_pred.npy", vp);
    write_npy(out_dir + "/surrogate_error.npy", ve);
  }
  return losses;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "-out") == 0) out_dir = argv[i + 1];
  if (!out_dir.empty()) {  // made where missing; a path that cannot be is refused before any work
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec || !std::filesystem::is_directory(out_dir)) {
      std::fprintf(stderr, "train_surrogate: -out %s: cannot make that directory (%s)\n", out_dir.c_str(),
                   ec ? ec.message().c_str() : "a file is in the way");
      return 2;
    }
  }
  std::atomic<int> failed = 0;
  auto program = [&](Comm& comm) {
    Outcome one, mesh22;
    bool first_run = true;
    const auto r = examples::train_against_one_rank(comm, [&](const DeviceMesh<2>& mesh, int*) {
      Outcome& o = first_run ? one : mesh22;
      const bool write = !first_run && !out_dir.empty();
      first_run = false;
      return train(mesh, &o, out_dir, write);
    });
    const bool same = r.worst <= 1e-4;
    const bool learned = mesh22.after < 0.1 && mesh22.after < mesh22.before / 3;
    if (comm.rank() == 0) {
      examples::print_losses(r.got, r.ref, "loss 2x2");
      std::printf("largest relative difference of the losses %.3g (limit 1e-4)\n", r.worst);
      std::printf("held-out relative L2 error against the solver on %s: %.4f before training, %.4f after "
                  "(one rank: %.4f, %.4f)\n",
                  r.mesh.c_str(), mesh22.before, mesh22.after, one.before, one.after);
      if (!out_dir.empty())
        std::printf("wrote %s/surrogate_{logk,u,pred,error}.npy; draw them: python3 examples/plot_surrogate.py %s\n",
                    out_dir.c_str(), out_dir.c_str());
      std::printf("%s\n", same && learned ? "OK: the 2x2 mesh trains like one rank, and the surrogate learned u"
                                          : "FAILED");
    }
    if (!(same && learned)) failed = 1;
  };
  examples::run_example(argc, argv, 4, program);
  return failed;
}

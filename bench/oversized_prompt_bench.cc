// What an oversized text prompt costs the server: a 3.9 MB text Generate sent to prefixd
// (in-process, on the tiny random model, CPU backend, loopback gRPC) is refused by its byte
// length before any tokenizing. Prints each round trip, their median, and, for scale, what
// tokenizing that text in full costs (what the server would spend without the byte-length rule).
//
//   oversized_prompt_bench [--reps 3] [--bytes 3900000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "grpcpp/grpcpp.h"
#include "prefixd/v1/inference.grpc.pb.h"
#include "server/server.h"
#include "tools/random_model.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// English-like text of `bytes` bytes: words of 2 to 9 letters.
std::string Text(size_t bytes) {
  std::string s;
  s.reserve(bytes);
  uint32_t x = 12345;
  while (s.size() < bytes) {
    x = x * 1103515245u + 12345u;
    const int len = 2 + static_cast<int>((x >> 16) % 8);
    s.push_back(' ');
    for (int i = 0; i < len && s.size() < bytes; ++i) {
      x = x * 1103515245u + 12345u;
      s.push_back(static_cast<char>('a' + (x >> 16) % 26));
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  size_t bytes = 3900000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (flag == "--bytes")
      bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: oversized_prompt_bench [--reps N] [--bytes N]\n");
      return 2;
    }
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / "oversized_prompt_bench_model").string();
  prefixd::RandomModelOptions mopt;
  mopt.out_dir = dir;
  mopt.seed = 7;
  if (absl::Status s = prefixd::WriteRandomModel(mopt); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  prefixd::ServerOptions o;
  o.model_dir = dir;
  o.device.device = "cpu";
  o.device.threads = 1;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "off";
  o.log = [](std::string_view) {};
  absl::StatusOr<std::unique_ptr<prefixd::Server>> server = prefixd::Server::Start(std::move(o));
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto stub = prefixd::v1::Inference::NewStub(grpc::CreateCustomChannel(
      (*server)->grpc_address(), grpc::InsecureChannelCredentials(), args));
  prefixd::v1::GenerateRequest req;
  req.set_text(Text(bytes));
  req.set_max_new_tokens(1);

  std::printf("text of %zu bytes, tiny model (context 256)\n", bytes);
  std::vector<double> rounds;
  for (int r = 0; r < reps; ++r) {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    prefixd::v1::GenerateResponse msg;
    const auto t0 = std::chrono::steady_clock::now();
    while (reader->Read(&msg)) {
    }
    const grpc::Status status = reader->Finish();
    const auto t1 = std::chrono::steady_clock::now();
    rounds.push_back(Seconds(t0, t1));
    std::printf("round trip %d: %.4f s, %s: %s\n", r + 1, rounds.back(),
                status.ok() ? "OK" : "refused", status.error_message().substr(0, 60).c_str());
  }
  std::vector<double> sorted = rounds;
  std::sort(sorted.begin(), sorted.end());
  std::printf("median round trip: %.4f s\n", sorted[sorted.size() / 2]);

  const auto t0 = std::chrono::steady_clock::now();
  const size_t tokens = (*server)->model().tokenizer().Encode(req.text()).size();
  const auto t1 = std::chrono::steady_clock::now();
  std::printf("tokenizing it in full (for scale): %.4f s, %zu tokens\n", Seconds(t0, t1), tokens);
  std::filesystem::remove_all(dir);
  return 0;
}

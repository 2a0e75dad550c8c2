#include "skippy/server/class_decision.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "skippy/common/digest.h"
#include "skippy/common/strings.h"
#include "skippy/runtime/llama_backend.h"

namespace skippy::server {

namespace fs = std::filesystem;

namespace {

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("model name")) {
      if (const size_t colon = line.find(':'); colon != std::string::npos) return line.substr(colon + 1);
    }
  }
  return "unknown";
}

fs::path FileOf(const std::string& dir, const std::string& key) {
  const Sha256Digest d = Sha256(key);
  return fs::path(dir) / "one-row-class" / (ToHex(std::span(d).first(8)) + ".json");
}

}  // namespace

std::string ClassDecisionKey(runtime::Engine& engine, std::string_view measure) {
  const runtime::ContextOptions& c = engine.context().options();
  return StrCat("measure=", std::string(measure), ";lane=", engine.LaneCapacity(), ";model=", engine.model_digest(), ";llama=", runtime::KernelBuild(), ";threads=", c.n_threads,
                ";flash_attn=", c.flash_attn ? 1 : 0, ";n_batch=", c.n_batch, ";n_ubatch=", c.n_ubatch,
                ";cpu=", CpuModel());
}

nlohmann::json ToJson(const ClassDecision& decision) {
  return nlohmann::json{{"on", decision.on}, {"measured", decision.measured}};
}

std::optional<ClassDecision> ClassDecisionOf(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("on") || !j["on"].is_boolean()) return std::nullopt;
  ClassDecision d;
  d.on = j["on"].get<bool>();
  if (j.contains("measured") && j["measured"].is_object()) d.measured = j["measured"];
  return d;
}

std::optional<ClassDecision> LoadClassDecision(const std::string& dir, const std::string& key) {
  std::ifstream in(FileOf(dir, key));
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("key") || !j["key"].is_string() || j["key"].get<std::string>() != key) {
    return std::nullopt;
  }
  return ClassDecisionOf(j);
}

Status SaveClassDecision(const std::string& dir, const std::string& key, const ClassDecision& decision) {
  const fs::path path = FileOf(dir, key);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return absl::UnavailableError(StrCat("cannot create ", path.parent_path().string(), ": ", ec.message()));
  const fs::path tmp = path.string() + StrCat(".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    nlohmann::json j = ToJson(decision);
    j["key"] = key;
    out << j.dump(2) << "\n";
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      return absl::UnavailableError(StrCat("cannot write ", tmp.string()));
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return absl::UnavailableError(StrCat("cannot rename into ", path.string()));
  }
  return absl::OkStatus();
}

}  // namespace skippy::server

#include "fleet_common.h"

#include <boost/json.hpp>
#include <chrono>
#include <fstream>
#include <thread>

#include "stitch/net/client.h"

namespace stitch {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kJudgedTokens = 8;

}  // namespace

std::vector<TensorView> Views(const std::vector<HostTensor>& tensors) {
  std::vector<TensorView> views;
  for (const HostTensor& t : tensors) views.push_back(t.view());
  return views;
}

std::vector<std::string> PoolUrls(const fs::path& pool) {
  std::vector<std::string> urls;
  std::ifstream in(pool);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') urls.push_back(line);
  }
  return urls;
}

bool JudgedRight(Oracle& oracle, const std::string& url, int64_t version) {
  boost::json::object body;
  boost::json::array prompt;
  for (int32_t id : oracle.options().prompts[0]) prompt.emplace_back(id);
  body["input_ids"] = std::move(prompt);
  body["sampling_params"] = boost::json::object{
      {"max_new_tokens", kJudgedTokens}, {"temperature", 0}, {"ignore_eos", true}};
  body["weight_version"] = boost::json::object{{"exact_version", version}};
  auto r = HttpFetch("POST", url + "/generate", boost::json::serialize(body), FetchOptions{});
  if (!r.ok() || r->status != 200) return false;
  boost::system::error_code ec;
  const boost::json::value answer = boost::json::parse(r->body, ec);
  const boost::json::object* o = !ec ? answer.if_object() : nullptr;
  const boost::json::value* ids = o != nullptr ? o->if_contains("output_ids") : nullptr;
  const boost::json::value* meta = o != nullptr ? o->if_contains("meta_info") : nullptr;
  if (ids == nullptr || !ids->is_array() || meta == nullptr || !meta->is_object()) return false;
  std::vector<int32_t> tokens;
  for (const boost::json::value& id : ids->get_array()) {
    if (!id.is_int64()) return false;
    tokens.push_back(static_cast<int32_t>(id.get_int64()));
  }
  const boost::json::value* start = meta->get_object().if_contains("weight_version_start");
  const boost::json::value* end = meta->get_object().if_contains("weight_version_end");
  if (start == nullptr || end == nullptr || !start->is_int64() || !end->is_int64()) return false;
  const Judgement judged =
      oracle.JudgeTokens(0, kJudgedTokens, tokens, start->get_int64(), end->get_int64());
  return judged.verdict == Verdict::kSame && start->get_int64() == version;
}

void SleepSeconds(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

}  // namespace stitch

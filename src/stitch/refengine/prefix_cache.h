// The reference engine's prefix cache: the keys and values of finished
// generations, kept so that a later request whose prompt starts with the
// same tokens, under the same cache-isolation key (SGLang `extra_key`, vLLM
// `cache_salt`) and the same weights, skips recomputing them.
//
// Entries hold the tokens a cache computed and the cache itself. The
// scheduler clears the whole cache whenever the weights change (an entry is
// only ever the product of the weights serving now), so entries of one
// version are never served to another; the sidecar's version-tagged keys
// keep versions apart across engines too. Least recently used entries go
// first once the entries' memory passes the budget; an entry whose tokens
// extend another's (a conversation's next turn) replaces it.
//
// Not thread-safe: the scheduler thread owns it.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <vector>

#include "stitch/refengine/model.h"

namespace stitch {

class PrefixCache {
 public:
  // `max_bytes`: the budget of the entries' keys and values; 0 keeps
  // nothing.
  explicit PrefixCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  struct Hit {
    const KvCache* cache = nullptr;  // null on a miss
    int64_t length = 0;              // positions of `tokens` it holds
  };
  // The entry of `key` sharing the longest prefix with `tokens`, and that
  // prefix's length (at most tokens.size()). The entry becomes the most
  // recently used. The pointer is valid until the next Insert or Clear.
  Hit Lookup(const std::string& key, std::span<const int32_t> tokens);

  // Keeps `cache`, which holds the keys and values of tokens[0,
  // cache.length()). Entries of `key` whose tokens it extends are dropped.
  void Insert(const std::string& key, std::span<const int32_t> tokens, KvCache cache);

  void Clear();
  size_t bytes() const { return bytes_; }
  size_t entries() const { return entries_.size(); }

 private:
  struct Entry {
    std::string key;
    std::vector<int32_t> tokens;
    KvCache cache;
    size_t bytes = 0;
  };
  void Evict();

  const size_t max_bytes_;
  size_t bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace stitch

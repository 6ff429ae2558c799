#include "stitch/refengine/prefix_cache.h"

#include <algorithm>
#include <utility>

namespace stitch {

PrefixCache::Hit PrefixCache::Lookup(const std::string& key, std::span<const int32_t> tokens) {
  // A linear scan: the budget keeps the entries few, and a step of the
  // forward pass costs far more than comparing token ids.
  auto best = entries_.end();
  int64_t best_length = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key != key) continue;
    const size_t limit = std::min<size_t>(
        {tokens.size(), it->tokens.size(), static_cast<size_t>(it->cache.length())});
    const auto mismatch = std::mismatch(
        tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(limit), it->tokens.begin());
    const auto length = static_cast<int64_t>(mismatch.first - tokens.begin());
    if (length > best_length) {
      best = it;
      best_length = length;
    }
  }
  if (best == entries_.end()) return Hit{};
  entries_.splice(entries_.begin(), entries_, best);
  return Hit{&entries_.front().cache, best_length};
}

void PrefixCache::Insert(const std::string& key, std::span<const int32_t> tokens, KvCache cache) {
  if (max_bytes_ == 0 || cache.length() == 0) return;
  const auto length = static_cast<size_t>(cache.length());
  for (auto it = entries_.begin(); it != entries_.end();) {
    const bool covered = it->key == key && it->tokens.size() <= length &&
                         std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin());
    if (covered) {
      bytes_ -= it->bytes;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  Entry e{key,
          std::vector<int32_t>(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(length)),
          std::move(cache), 0};
  e.bytes = e.cache.memory_bytes() + e.tokens.size() * sizeof(int32_t) + e.key.size();
  if (e.bytes > max_bytes_) return;
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
  Evict();
}

void PrefixCache::Clear() {
  entries_.clear();
  bytes_ = 0;
}

void PrefixCache::Evict() {
  while (bytes_ > max_bytes_ && !entries_.empty()) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
}

}  // namespace stitch

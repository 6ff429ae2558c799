// The gateway's session table: the value (a replica) each session last used,
// bounded in bytes. Past its budget the least recently used sessions are
// forgotten; such a session then lands on a replica by load, which is
// correct, only less cache-friendly.
//
// An entry costs its key's bytes plus kEntryOverhead (the list node, the
// index slot and the allocator's headers, rounded up), so a table of
// `max_bytes` holds about max_bytes / (key size + kEntryOverhead) sessions
// whatever the keys look like. Not thread-safe (the gateway's loop owns it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace stitch {

template <typename Value>
class SessionTable {
 public:
  struct Entry {
    std::string key;
    Value value;
  };
  static constexpr size_t kEntryOverhead =
      sizeof(Entry) + 2 * sizeof(void*) +                                             // list node
      sizeof(std::pair<std::string_view, typename std::list<Entry>::iterator>) + 1 +  // slot
      32;  // allocator headers

  explicit SessionTable(size_t max_bytes) : max_bytes_(max_bytes) {}
  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;

  // The value of `key`, or null. Does not count as a use. Valid until the
  // next Put.
  const Value* Find(std::string_view key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &it->second->value;
  }

  // Sets the value of `key` and makes it the most recently used, then
  // forgets the least recently used sessions until the table fits its
  // budget. A key that alone would not fit is not kept.
  void Put(std::string_view key, Value value) {
    if (auto it = index_.find(key); it != index_.end()) {
      it->second->value = std::move(value);
      lru_.splice(lru_.begin(), lru_, it->second);
      return;
    }
    const size_t cost = Cost(key);
    if (cost > max_bytes_) return;
    lru_.push_front(Entry{std::string(key), std::move(value)});
    index_.emplace(std::string_view(lru_.front().key), lru_.begin());
    bytes_ += cost;
    while (bytes_ > max_bytes_) {
      const Entry& oldest = lru_.back();
      bytes_ -= Cost(oldest.key);
      index_.erase(std::string_view(oldest.key));
      lru_.pop_back();
      ++evictions_;
    }
  }

  size_t size() const { return lru_.size(); }
  // What the entries cost, as counted against the budget.
  size_t bytes() const { return bytes_; }
  size_t max_bytes() const { return max_bytes_; }
  // Sessions forgotten to stay within the budget so far.
  uint64_t evictions() const { return evictions_; }

 private:
  static size_t Cost(std::string_view key) { return key.size() + kEntryOverhead; }

  const size_t max_bytes_;
  std::list<Entry> lru_;  // most recently used first
  absl::flat_hash_map<std::string_view, typename std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace stitch

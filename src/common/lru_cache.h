// A bounded, thread-safe LRU cache with hit/miss/eviction counters. Keys are structural (built
// from everything that changes the cached artifact), never object addresses.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "fusedattn/fusedattn.h"

namespace fusedattn {

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The cached value for key, or nullptr. A hit moves the entry to the front.
  std::shared_ptr<Value> find(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  // The cached value for key, or nullptr, without counting a hit or miss or reordering (a
  // second look under another lock, after a find() that missed).
  std::shared_ptr<Value> peek(const Key& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : it->second->second;
  }

  // Inserts (or replaces) and returns the stored value; evicts the least recently used entries
  // beyond capacity. Evicted values stay alive while someone holds their shared_ptr.
  std::shared_ptr<Value> insert(const Key& key, std::shared_ptr<Value> value) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      // Another thread built the same entry meanwhile: keep the first, so every caller shares it.
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    while (index_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++evictions_;
    }
    return order_.front().second;
  }

  // Replaces key's value with value if it is still `expected` (a decision made again from it),
  // and returns the stored value: value, or what another thread stored first. A key no longer
  // cached (evicted, cleared) gets value.
  std::shared_ptr<Value> replace(const Key& key, const std::shared_ptr<Value>& expected,
                                 std::shared_ptr<Value> value) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = index_.find(key);
      if (it != index_.end()) {
        order_.splice(order_.begin(), order_, it->second);
        if (it->second->second == expected) it->second->second = std::move(value);
        return it->second->second;
      }
    }
    return insert(key, std::move(value));
  }

  // Finds, or builds with make() outside the lock and inserts. make returns a shared_ptr or
  // nullptr (nothing is cached then).
  template <typename Make>
  std::shared_ptr<Value> get_or_make(const Key& key, Make&& make) {
    if (auto hit = find(key)) return hit;
    std::shared_ptr<Value> made = make();
    if (!made) return nullptr;
    return insert(key, std::move(made));
  }

  void set_capacity(size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = capacity < 1 ? 1 : capacity;
    while (index_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++evictions_;
    }
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    index_.clear();
    order_.clear();
  }

  fusedattn_cache_stats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    fusedattn_cache_stats s{};
    s.hits = hits_;
    s.misses = misses_;
    s.evictions = evictions_;
    s.entries = index_.size();
    s.capacity = capacity_;
    return s;
  }

 private:
  using Entry = std::pair<Key, std::shared_ptr<Value>>;
  mutable std::mutex mutex_;
  size_t capacity_;
  std::list<Entry> order_;  // most recent first
  std::unordered_map<Key, typename std::list<Entry>::iterator, Hash> index_;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

// FNV-1a over 64-bit words; used to hash structural keys.
inline uint64_t HashWords(const int64_t* words, size_t count) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < count; ++i) {
    uint64_t w = static_cast<uint64_t>(words[i]);
    for (int b = 0; b < 8; ++b) {
      h ^= (w >> (8 * b)) & 0xFF;
      h *= 1099511628211ull;
    }
  }
  return h;
}

}  // namespace fusedattn

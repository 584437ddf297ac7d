// A directory of blobs keyed by strings, shared by the processes of one user: what a backend
// builds slowly (cuDNN's compiled kernels) is written once and read by the next process.
//
// Every entry is one file, named by a 128-bit hash of its key, holding a header (magic, format
// version, key and payload lengths, a checksum over all of it), the key itself and the payload.
// The rules that make it safe without locks:
//   * a writer writes a temporary file in the same directory, fsyncs it and renames it over the
//     entry's name, so a reader opens either the old complete file or the new complete one;
//     two processes writing one key both write complete files and the last rename wins;
//   * a reader accepts a file only when its size, magic, version, checksum and key all match;
//     anything else (truncated, corrupt, another key with the same hash, an older format) is a
//     miss, counted, never an error: the caller rebuilds and put() replaces the file;
//   * the directory is bounded: after each put() the oldest entries (by modification time, which
//     a hit refreshes) are removed until the total is under three quarters of max_bytes (never
//     the entry just written; an entry larger than max_bytes is not stored);
//     temporary files that a crashed writer left behind are removed after an hour;
//   * entries may hold code that gets loaded (compiled kernels), so the directory must belong to
//     the user and be writable by nobody else; otherwise the cache stays off and says why.
// POSIX only (open/rename/fsync/readdir). Thread-safe: the object holds no mutable state but
// counters.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace fusedattn {

// Where the on-disk cache lives, from the environment:
//   FUSEDATTN_CACHE_DIR   a directory; "", "0", "off", "false", "no" turn the cache off
//   (unset)               $XDG_CACHE_HOME/fusedattn, else $HOME/.cache/fusedattn
//   FUSEDATTN_CACHE_MAX_MB  the size bound in MiB (default 1024)
struct CacheLocation {
  bool enabled = false;
  std::string directory;  // when enabled
  std::string reason;     // when not: why (names the variable and its value)
  uint64_t max_bytes = 0;
};
CacheLocation CacheLocationFromEnvironment();

class BlobCache {
 public:
  static constexpr uint64_t kDefaultMaxBytes = uint64_t{1024} << 20;

  // Uses directory (created with mode 0700, parents too, when missing). When it cannot be used,
  // status() says why and every get() misses, every put() does nothing.
  BlobCache(std::string directory, uint64_t max_bytes);
  // A cache that is off for reason.
  static BlobCache Disabled(std::string reason);

  BlobCache(BlobCache&& other) noexcept;
  BlobCache(const BlobCache&) = delete;
  BlobCache& operator=(const BlobCache&) = delete;

  bool enabled() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const std::string& directory() const { return directory_; }
  uint64_t max_bytes() const { return max_bytes_; }

  enum class Lookup {
    kHit,
    kMiss,      // no file for the key, or a file of another key that hashes alike
    kDamaged,   // a file of the key that cannot be trusted (size, magic, version, checksum)
  };
  // The payload stored under key. A hit refreshes the file's modification time (LRU).
  Lookup get(const std::string& key, std::vector<uint8_t>* payload) const;

  // Stores payload under key (atomically replacing any file there), then evicts. A failure
  // (disk full, permissions) is returned for diagnostics; the cache stays usable.
  Status put(const std::string& key, const void* payload, size_t bytes) const;

  // The path of key's file (tests corrupt or truncate it).
  std::string path_of(const std::string& key) const;

  struct Stats {
    uint64_t hits = 0, misses = 0, damaged = 0, writes = 0, write_failures = 0, evictions = 0;
  };
  Stats stats() const;

  // The header's format version; a file of another version is damaged (rewritten).
  static constexpr uint32_t kFormatVersion = 1;
  static constexpr size_t kHeaderBytes = 40;

 private:
  BlobCache() = default;
  // Removes the oldest entries but keep (the one just written) while over the bound.
  void evict(const std::string& keep) const;

  Status status_;
  std::string directory_;
  uint64_t max_bytes_ = kDefaultMaxBytes;
  mutable std::atomic<uint64_t> hits_{0}, misses_{0}, damaged_{0}, writes_{0},
      write_failures_{0}, evictions_{0}, temp_counter_{0};
};

// 64-bit hash of bytes (not cryptographic; the checksum of entries and the halves of their
// names). Exposed for tests.
uint64_t HashBytes(const void* data, size_t bytes, uint64_t seed);

}  // namespace fusedattn
